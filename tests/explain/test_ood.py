"""keras_vit.ood: the six scores, their feature sets, fit, threshold and percentile, the file beside a
checkpoint, and the plain-words line."""

import dataclasses

import numpy as np
import pytest

from tests.conftest import randomize, tiny_vit, to_numpy
from keras_vit import ood


def clusters(n=400, d=6, seed=0):
    """Features of 3 classes around separate means, with their labels."""
    rng = np.random.default_rng(seed)
    means = rng.normal(0, 5, (3, d))
    labels = np.arange(n) % 3
    return means[labels] + rng.normal(0, 1, (n, d)), labels, means


def fit(method, feats, labels, num_classes=3, **kwargs):
    logits = np.zeros((len(feats), num_classes))
    return ood.fit_features(method, feats, logits, labels, **kwargs)


def test_mahalanobis_is_small_near_a_class_and_large_far_from_all():
    feats, labels, means = clusters()
    stats = fit("mahalanobis", feats, labels)
    np.testing.assert_allclose(stats.arrays["means"][0], [feats[labels == c].mean(0) for c in range(3)])
    near, far = means + 0.1, means.mean(0) + 30.0
    scores = ood.scores(stats, np.vstack([near, far]), np.zeros((4, 3)))
    assert scores[:3].max() < 1.0 < 100.0 < scores[3]
    # The shared covariance is whitened: a unit step along a high-variance axis costs less.
    stretched = np.column_stack([feats[:, 0] * 10, feats[:, 1:]])
    s = fit("mahalanobis", stretched, labels)
    step = np.zeros((2, 6))
    step[0, 0], step[1, 1] = 5.0, 5.0
    assert ood.scores(s, s.arrays["means"][0, 0] + step, np.zeros((2, 3))).argmin() == 0


def test_feature_set_scores_sum_and_classes_without_images_are_skipped():
    feats, labels, _ = clusters()
    two = np.stack([feats, feats[:, ::-1] * 2], axis=1)  # (B, 2, D): two feature sets
    logits = np.zeros((len(two), 4))
    for method in ("mahalanobis", "rmds", "knn"):
        stats = ood.fit_features(method, two, logits, labels, blocks=(0,), pooled=True, neighbours=5)  # class 3: none
        each = [ood.scores(ood.fit_features(method, two[:, i], logits, labels, neighbours=5), two[:, i], logits)
                for i in range(2)]
        summed = ood.scores(stats, two, logits)
        np.testing.assert_allclose(summed, each[0] + each[1], rtol=1e-9)
        assert np.isfinite(summed).all()
    stats = ood.fit_features("mahalanobis", two, logits, labels, blocks=(0,), pooled=True)
    assert stats.arrays["means"].shape == (2, 4, 6) and np.isnan(stats.arrays["means"][:, 3]).all()
    # Each is the distance to the nearest class: brute force over the classes for a few rows.
    precision, means = stats.arrays["precision"][0], stats.arrays["means"][0, :3]
    first = ood.scores(ood.fit_features("mahalanobis", two[:, 0], logits, labels), two[:3, 0], logits[:3])
    for b in range(3):
        assert first[b] == pytest.approx(min((two[b, 0] - m) @ precision @ (two[b, 0] - m) for m in means), rel=1e-9)
    with pytest.raises(ValueError, match=r"features of 2 sets, but blocks \[\] and pooled=True make 1"):
        ood.fit_features("mahalanobis", two, logits, labels)


def test_rmds_vim_and_knn_match_their_definitions():
    feats, labels, _ = clusters(d=8)
    x = feats[:5] + np.random.default_rng(3).normal(0, 3, (5, 8))
    # RMDS: the nearest class's distance less the distance to the mean of all features.
    rmds = fit("rmds", feats, labels)
    mahalanobis = ood.scores(fit("mahalanobis", feats, labels), x, np.zeros((5, 3)))
    centered = feats - feats.mean(0)
    whole = np.linalg.inv(centered.T @ centered / len(feats))
    background = np.einsum("bd,de,be->b", x - feats.mean(0), whole, x - feats.mean(0))
    np.testing.assert_allclose(ood.scores(rmds, x, np.zeros((5, 3))), mahalanobis - background, atol=1e-2)  # the ridge
    # KNN: the distance of the unit vectors to the k-th nearest training one.
    knn = fit("knn", feats, labels, neighbours=7)
    unit = lambda a: a / np.linalg.norm(a, axis=-1, keepdims=True)  # noqa: E731
    distances = np.linalg.norm(unit(x)[:, None] - unit(feats)[None], axis=-1)
    np.testing.assert_allclose(ood.scores(knn, x, np.zeros((5, 3))), np.sort(distances, 1)[:, 6], rtol=1e-6)
    # ViM: the residual off the principal half of the space, scaled to the logits, less their log-sum-exp.
    rng = np.random.default_rng(4)
    kernel, bias = rng.normal(size=(8, 3)), rng.normal(size=3)
    logits = feats @ kernel + bias
    vim = ood.fit_features("vim", feats, logits, labels, classifier=(kernel, bias))
    origin = -np.linalg.pinv(kernel.T) @ bias
    np.testing.assert_allclose(origin @ kernel + bias, 0, atol=1e-9)
    c = feats - origin
    _, vectors = np.linalg.eigh(c.T @ c / len(c))
    residual = lambda a: np.linalg.norm((a - origin) @ vectors[:, :4], axis=-1)  # noqa: E731
    alpha = logits.max(-1).mean() / residual(feats).mean()
    x_logits = x @ kernel + bias
    expected = alpha * residual(x) - np.log(np.exp(x_logits).sum(-1))
    np.testing.assert_allclose(ood.scores(vim, x, x_logits), expected, rtol=1e-6)
    with pytest.raises(ValueError, match="method 'vim' needs classifier"):
        fit("vim", feats, labels)
    with pytest.raises(ValueError, match="neighbours=500 is not allowed with 400 training images"):
        fit("knn", feats, labels, neighbours=500)
    assert int(fit("knn", feats, labels).arrays["neighbours"]) == ood.KNN_NEIGHBOURS
    assert int(fit("knn", feats[:20], labels[:20]).arrays["neighbours"]) == 20  # a set smaller than the default k


def test_msp_and_energy_rise_as_the_logits_flatten():
    logits = np.array([[10.0, 0, 0], [2.0, 1, 0], [0.0, 0, 0]])
    msp, energy = (ood.scores(fit(m, np.zeros((3, 1)), np.zeros(3)), np.zeros((3, 1)), logits)
                   for m in ("msp", "energy"))
    assert np.all(np.diff(msp) > 0) and msp[2] == pytest.approx(2 / 3)
    assert np.all(np.diff(energy) > 0) and energy[2] == pytest.approx(-np.log(3))


def test_features_are_the_blocks_mean_tokens_then_what_the_classifier_takes():
    model = randomize(tiny_vit())
    pixels = np.random.default_rng(0).integers(0, 256, (5, 32, 32, 3)).astype("uint8")
    feats, logits = ood.features(model, pixels, "all+pooled", batch_size=2)
    assert feats.shape == (5, model.num_layers + 1, model.hidden_dim) and feats.dtype == np.float64
    np.testing.assert_allclose(logits, to_numpy(model(model.normalize(pixels))), rtol=1e-4, atol=1e-4)
    x = model.embed_tokens(model.normalize(pixels))
    for i, block in enumerate(model.encoder.blocks):
        x = block(x)
        np.testing.assert_allclose(feats[:, i], to_numpy(x).mean(1), rtol=1e-4, atol=1e-4)
    head_input = to_numpy(model.head.features(model.encoder.norm_output(x)))
    np.testing.assert_allclose(feats[:, -1], head_input, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ood.features(model, pixels, "pooled")[0][:, 0], head_input, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ood.features(model, pixels, [-1])[0][:, 0], feats[:, 1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("blocks, expected", [
    ("pooled", ((), True)), ("all", ((0, 1, 2), False)), (None, ((0, 1, 2), False)), ("all+pooled", ((0, 1, 2), True)),
    (1, ((2,), False)), ([0, -1], ((0, 2), False)), ([2, "pooled"], ((2,), True)), (["pooled"], ((), True)),
])
def test_block_choice_names_blocks_and_the_pooled_features(blocks, expected):
    assert ood.block_choice(blocks, 3) == expected


def test_bad_choices_name_what_is_allowed():
    with pytest.raises(ValueError, match=r"Unknown out-of-domain method 'odin'; available: \['msp', 'energy'"):
        ood.check_method("odin")
    with pytest.raises(ValueError, match="scores the pooled features only; got blocks='all'"):
        ood.check_method("vim", "all")
    with pytest.raises(ValueError, match="blocks='last' is not allowed; use one of"):
        ood.block_choice("last", 3)
    with pytest.raises(ValueError, match=r"indices=\[5\] is not allowed"):
        ood.block_choice([5], 3)
    assert ood.parse_blocks("all+pooled") == "all+pooled" and ood.parse_blocks("4,-1,pooled") == [4, -1, "pooled"]
    with pytest.raises(ValueError, match="blocks 'four' is not allowed"):
        ood.parse_blocks("four")
    with pytest.raises(ValueError, match="this model has num_classes=0"):
        ood.features(tiny_vit(num_classes=0), np.zeros((1, 32, 32, 3)))


@pytest.mark.parametrize("method", ood.METHODS)
def test_fit_threshold_save_reload_and_check_every_method(tmp_path, method):
    model = randomize(tiny_vit())
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (90, 32, 32, 3)).astype("uint8")
    blocks = "pooled" if method == "vim" else ood.DEFAULT_BLOCKS
    stats = ood.fit(model, pixels[:50], np.arange(50) % model.num_classes, method, blocks, neighbours=5)
    held = ood.score(model, pixels[50:], stats)
    stats = ood.with_threshold(stats, held, false_alarm=0.1)
    assert stats.false_alarm == pytest.approx(0.1) and np.mean(held > stats.threshold) == pytest.approx(0.1)
    np.testing.assert_array_equal(stats.reference, np.sort(held))
    checkpoint = tmp_path / "model.keras"
    assert ood.load_for(str(checkpoint)) is None and ood.stats_path(str(checkpoint)) == str(tmp_path / "ood.npz")
    ood.save(stats, ood.stats_path(str(checkpoint)))
    assert [p.name for p in tmp_path.iterdir()] == ["ood.npz"]  # the temporary file was renamed
    loaded = ood.load_for(str(checkpoint), model)
    assert (loaded.method, loaded.blocks, loaded.pooled, loaded.threshold, loaded.false_alarm) == (
        method, stats.blocks, stats.pooled, stats.threshold, stats.false_alarm)
    verdict, again = ood.check(model, pixels[:8], stats), ood.check(model, pixels[:8], loaded)
    np.testing.assert_allclose(again.score, verdict.score, rtol=1e-5)  # the KNN bank is stored as float32
    np.testing.assert_array_equal(again.unusual, verdict.score > stats.threshold)
    np.testing.assert_allclose(verdict.percentile, [100 * np.mean(held < s) for s in verdict.score])
    with pytest.raises(ValueError, match="false_alarm=5 is not a share"):
        ood.with_threshold(stats, held, 5)
    with pytest.raises(ValueError, match="no threshold"):
        ood.check(model, pixels[:1], dataclasses.replace(stats, threshold=None))


def test_statistics_whose_check_is_off_keep_the_reason_and_refuse_a_long_or_contradicting_one(tmp_path):
    path = str(tmp_path / "ood.npz")
    feats, labels, _ = clusters(d=48)
    stats = dataclasses.replace(fit("mahalanobis", feats, labels, 5), off="The check is off: too few images.")
    ood.save(stats, path)
    loaded = ood.load(path)
    assert loaded.off == stats.off and loaded.threshold is None and loaded.reference is None
    good = dict(np.load(path))
    for change, message in [({"off": np.str_("x" * (ood.MAX_OFF_CHARS + 1))}, "at most 500 characters"),
                            ({"off": np.arange(3)}, "'off' must be one text"),
                            ({"threshold": np.float64(1.0), "false_alarm": np.float64(0.05),
                              "reference": np.arange(5.0)}, "holds a threshold and says the check is off")]:
        np.savez(path, **{**good, **change})
        with pytest.raises(ValueError, match=message):
            ood.load(path)


def test_the_message_is_a_percentile_in_plain_words_never_the_score():
    stats = ood.with_threshold(fit("msp", np.zeros((3, 1)), np.zeros(3)), np.linspace(0, 1, 5000), 0.05)
    verdict = ood.Verdict(np.array([0.5, 0.9981, 7.0]), stats.percentile([0.5, 0.9981, 7.0]),
                          np.array([0.5, 0.9981, 7.0]) > stats.threshold, len(stats.reference))
    assert verdict.message(0) == ""
    assert verdict.message(1) == ("This image is less like the training images than 99.8% of them, so these "
                                  "classes are guesses.")
    assert verdict.message(2) == ("This image is less like the training images than all 5,000 held-out ones, so these "
                                  "classes are guesses.")
    assert "7" not in verdict.message(2).replace("5,000", "")  # no raw score
    assert ood.describe(99.96, True, 5000).endswith("than 99.9% of them, so these classes are guesses.")


def test_load_refuses_files_that_are_not_statistics(tmp_path, monkeypatch):
    path = str(tmp_path / "ood.npz")
    model = randomize(tiny_vit())
    feats, labels, _ = clusters(d=48)
    stats = ood.with_threshold(fit("mahalanobis", feats, labels, 5), np.arange(10.0))
    ood.save(stats, path)
    with pytest.raises(ValueError, match=r"statistics of 5 classes and width 48 on blocks \[\] \(pooled: True\), but "
                                         r"the model has 5 classes, 2 blocks and width 36 there"):
        ood.load(path, randomize(tiny_vit(hidden_dim=36)))
    assert ood.load(path, model).method == "mahalanobis"
    good = dict(np.load(path))
    for change, message in [
        ({"array_precision": np.zeros((1, 5, 5))}, r"array 'precision' has shape \(1, 5, 5\), which does not fit"),
        ({"method": np.str_("odin")}, "unknown method 'odin'"),
        ({"method": np.str_("knn")}, r"method 'knn' keeps arrays \['bank', 'neighbours'\]"),
        ({"format": np.int64(7)}, "has format 7; this keras_vit reads format 2"),
        ({"reference": np.array([3.0, 1.0])}, "the held-out scores must be a sorted list"),
        ({"array_precision": np.full((1, 48, 48), np.inf)}, "array 'precision'"),
        ({"blocks": np.array([0, 0])}, r"on blocks \[0, 0\] \(pooled: True\) is not a choice"),
    ]:
        np.savez(path, **{**good, **change})
        with pytest.raises(ValueError, match=message):
            ood.load(path)
    np.savez(path, means=np.zeros((2, 3, 4)), precision=np.zeros((2, 4, 4)), method=np.str_("mahalanobis"))
    with pytest.raises(ValueError, match="statistics of an older keras_vit .* python -m training.ood_stats"):
        ood.load(path)
    np.savez(path, weights=np.zeros(3))
    with pytest.raises(ValueError, match=r"no out-of-domain statistics: \['blocks', 'format', 'method', 'num_classes'"):
        ood.load(path)
    np.savez(path, **{**good, "array_means": np.array([{"a": 1}], dtype=object)})
    with pytest.raises(ValueError, match="allow_pickle=False"):  # nothing is unpickled
        ood.load(path)
    monkeypatch.setattr(ood.stats_file, "MAX_FILE_BYTES", 10)
    with pytest.raises(ValueError, match="out-of-domain statistics are at most 10"):
        ood.load(path)
