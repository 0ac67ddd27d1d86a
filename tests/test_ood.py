"""keras_vit.ood: the scores, the statistics and their file."""

import numpy as np
import pytest

from conftest import randomize, tiny_vit, to_numpy
from keras_vit import ood


def clusters(n=400, d=6, seed=0):
    """Features of 3 classes around separate means, with their labels."""
    rng = np.random.default_rng(seed)
    means = rng.normal(0, 5, (3, d))
    labels = np.arange(n) % 3
    return means[labels] + rng.normal(0, 1, (n, d)), labels, means


def test_mahalanobis_is_small_near_a_class_and_large_far_from_all():
    feats, labels, means = clusters()
    stats = ood.fit_features(feats, labels, 3)
    np.testing.assert_allclose(stats.means[0], [feats[labels == c].mean(0) for c in range(3)])
    near = means + 0.1
    far = means.mean(0) + 30.0
    logits = np.zeros((4, 3))
    scores = ood.scores(np.vstack([near, far]), logits, stats)["mahalanobis"]
    assert scores[:3].max() < 1.0 < 100.0 < scores[3]
    # The shared covariance is whitened: a unit step along a high-variance axis costs less.
    stretched = np.column_stack([feats[:, 0] * 10, feats[:, 1:]])
    s = ood.fit_features(stretched, labels, 3)
    step = np.zeros((2, 6))
    step[0, 0], step[1, 1] = 5.0, 5.0
    assert ood.scores(s.means[0, 0] + step, np.zeros((2, 3)), s)["mahalanobis"].argmin() == 0


def test_mahalanobis_sums_over_feature_sets_and_skips_classes_without_images():
    feats, labels, _ = clusters()
    two = np.stack([feats, feats[:, ::-1] * 2], axis=1)  # (B, 2, D): two feature sets
    stats = ood.fit_features(two, labels, 4)  # class 3 has no images
    assert stats.means.shape == (2, 4, 6) and stats.precision.shape == (2, 6, 6) and np.isnan(stats.means[:, 3]).all()
    each = [ood.scores(two[:, i], np.zeros((len(two), 4)), ood.fit_features(two[:, i], labels, 4))["mahalanobis"]
            for i in range(2)]
    summed = ood.scores(two, np.zeros((len(two), 4)), stats)["mahalanobis"]
    np.testing.assert_allclose(summed, each[0] + each[1], rtol=1e-9)
    assert np.isfinite(summed).all()
    # Each is the distance to the nearest class: brute force over the classes for a few rows.
    for b in range(3):
        brute = min((two[b, 0] - m) @ stats.precision[0] @ (two[b, 0] - m) for m in stats.means[0, :3])
        assert each[0][b] == pytest.approx(brute, rel=1e-9)


def test_msp_and_energy_rise_as_the_logits_flatten():
    logits = np.array([[10.0, 0, 0], [2.0, 1, 0], [0.0, 0, 0]])
    out = ood.scores(np.zeros((3, 1)), logits)
    assert set(out) == {"msp", "energy"}
    assert np.all(np.diff(out["msp"]) > 0) and out["msp"][2] == pytest.approx(2 / 3)
    assert np.all(np.diff(out["energy"]) > 0) and out["energy"][2] == pytest.approx(-np.log(3))


def test_features_are_each_blocks_mean_token_and_logits_are_the_models():
    model = randomize(tiny_vit())
    pixels = np.random.default_rng(0).integers(0, 256, (5, 32, 32, 3)).astype("uint8")
    feats, logits = ood.features(model, pixels, batch_size=2)
    assert feats.shape == (5, model.num_layers, model.hidden_dim) and feats.dtype == np.float64
    np.testing.assert_allclose(logits, to_numpy(model(model.normalize(pixels))), rtol=1e-4, atol=1e-4)
    x = model.embed_tokens(model.normalize(pixels))
    for i, block in enumerate(model.encoder.blocks):
        x = block(x)
        np.testing.assert_allclose(feats[:, i], to_numpy(x).mean(1), rtol=1e-4, atol=1e-4)


def test_fit_threshold_save_and_load_for_a_checkpoint(tmp_path):
    model = randomize(tiny_vit())
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (60, 32, 32, 3)).astype("uint8")
    stats = ood.fit(model, pixels[:40], labels=np.arange(40) % model.num_classes)
    held = ood.score(model, pixels[40:], stats)
    stats = ood.with_threshold(stats, held, false_alarm=0.1)
    assert stats.false_alarm == pytest.approx(0.1) and np.mean(held > stats.threshold) == pytest.approx(0.1)
    checkpoint = tmp_path / "model.keras"
    assert ood.load_for(str(checkpoint)) is None and ood.stats_path(str(checkpoint)) == str(tmp_path / "ood.npz")
    ood.save(stats, ood.stats_path(str(checkpoint)))
    loaded = ood.load_for(str(checkpoint), model)
    np.testing.assert_allclose(loaded.precision, stats.precision, rtol=1e-6)  # stored as float32
    assert (loaded.threshold, loaded.method, loaded.false_alarm) == (stats.threshold, "mahalanobis", stats.false_alarm)
    assert [p.name for p in tmp_path.iterdir()] == ["ood.npz"]  # the temporary file was renamed
    with pytest.raises(ValueError, match="false_alarm=5 is not a share"):
        ood.with_threshold(stats, held, 5)


def test_load_refuses_files_that_are_not_statistics(tmp_path, monkeypatch):
    path = str(tmp_path / "ood.npz")
    np.savez(path, means=np.zeros((2, 3, 4)), precision=np.zeros((2, 5, 5)), method=np.str_("mahalanobis"))
    with pytest.raises(ValueError, match=r"means \(2, 3, 4\), precision \(2, 5, 5\) .* do not fit together"):
        ood.load(path)
    np.savez(path, means=np.zeros((2, 3, 4)), precision=np.stack([np.eye(4)] * 2), method=np.str_("mahalanobis"))
    with pytest.raises(ValueError, match="statistics of 2 blocks, 3 classes and width 4, but the model has 2, 5 and 48"):
        ood.load(path, tiny_vit())
    np.savez(path, weights=np.zeros(3))
    with pytest.raises(ValueError, match=r"no out-of-domain statistics: \['means', 'method', 'precision'\] missing"):
        ood.load(path)
    np.savez(path, means=np.array([{"a": 1}], dtype=object), precision=np.eye(1)[None], method=np.str_("mahalanobis"))
    with pytest.raises(ValueError, match="allow_pickle=False"):  # nothing is unpickled
        ood.load(path)
    monkeypatch.setattr(ood, "MAX_FILE_BYTES", 10)
    with pytest.raises(ValueError, match="out-of-domain statistics are at most 10"):
        ood.load(path)
