"""Patch sequences (NaFlex) as a ViT input: the two preprocessing paths, masking, position
embeddings per grid, saving, training, and the one-line errors. timm parity (and timm's budget
rule and patchify) is in tests/checkpoints/test_checkpoints_timm_naflex.py."""

import keras
import numpy as np
import pytest
from tests.conftest import logits, randomize, random_vit, tiny_vit, to_numpy

from keras_vit import naflex

SHAPES = [(32, 32), (20, 60), (70, 12), (9, 50)]


def _images(shapes=SHAPES, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.uniform(0, 255, (*s, 3)).astype("float32") for s in shapes]


@pytest.mark.one_backend
def test_numpy_and_tensorflow_preprocessing_give_the_same_sequences():
    import tensorflow as tf

    images = _images([(32, 32), (20, 60), (70, 12), (300, 41)])
    expected = naflex.patch_sequences(images, 4, 64, mean=(0.4, 0.5, 0.6), std=(0.2, 0.3, 0.4))
    for i, image in enumerate(images):
        got = naflex.patch_sequence(tf.constant(image), 4, 64, mean=(0.4, 0.5, 0.6), std=(0.2, 0.3, 0.4))
        for key in naflex.KEYS:
            np.testing.assert_allclose(got[key].numpy(), expected[key][i], atol=2e-4, err_msg=key)


@pytest.mark.parametrize("kind, pooling", [("learned", "token"), ("factorized", "gap"), ("sincos", "map")])
def test_an_image_at_the_tables_grid_gives_its_image_logits(kind, pooling):
    """A 32 x 32 image under a budget of 64 = 8 x 8 patches is not resampled: its sequence is the
    image cut in patches, and its logits are the image's."""
    model = random_vit(position_embedding=kind, pooling=pooling, num_register_tokens=1)
    image = _images([(32, 32)])[0]
    expected = logits(model, ((image / 255.0 - 0.5) / 0.5)[None])
    np.testing.assert_allclose(logits(model, naflex.patch_sequences([image], 4, 64)), expected, atol=2e-5)


@pytest.mark.parametrize("kind, pooling", [("learned", "map"), ("sincos", "token")])
def test_padding_changes_nothing(kind, pooling):
    """Each image of a padded batch gets the logits it gets alone, at another padding, and whatever
    the padding tokens hold: they are masked in attention and pooling."""
    model = random_vit(position_embedding=kind, pooling=pooling, class_token=pooling == "token",
                       resample_keep_aspect=True)
    images = _images()
    batch = naflex.patch_sequences(images, 4, 64)
    out = logits(model, batch)
    for i, image in enumerate(images):
        alone = naflex.patch_sequences([image], 4, 64)
        longer = {k: np.concatenate([v, np.zeros_like(v[:, :16])], axis=1) for k, v in alone.items()}  # L = 80
        np.testing.assert_allclose(logits(model, longer)[0], out[i], atol=2e-5)
    noisy = dict(batch, patches=np.where(batch["patch_valid"][..., None], batch["patches"], 7.0).astype("float32"))
    noisy["patch_coord"] = np.where(batch["patch_valid"][..., None], batch["patch_coord"], 3).astype("int32")
    np.testing.assert_allclose(logits(model, noisy), out, atol=2e-5)


@pytest.mark.parametrize("kind, keep_aspect", [("learned", False), ("factorized", True)])
def test_dynamic_image_size_and_patch_sequences_resample_alike(kind, keep_aspect):
    """An image at another grid through `dynamic_image_size` (one table for the batch) and as a patch
    sequence (a table per image) gets one position embedding, with and without keep_aspect."""
    model = random_vit(position_embedding=kind, dynamic_image_size=True, resample_keep_aspect=keep_aspect,
                       resample_method="bicubic")
    image = _images([(20, 60)])[0]
    pixels = (naflex.resize_to_budget(image, 4, 64) / 255.0 - 0.5) / 0.5  # (16, 48, 3): a 4 x 12 grid
    expected = logits(model, pixels[None])
    np.testing.assert_allclose(logits(model, naflex.patch_sequences([image], 4, 64)), expected, atol=2e-5)


def test_keras_file_round_trip_in_safe_mode(tmp_path):
    model = randomize(tiny_vit(position_embedding="factorized", pooling="map", max_seq_len=64,
                               resample_keep_aspect=True))
    batch = naflex.patch_sequences(_images(), 4, 64)
    path = tmp_path / "naflex.keras"
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert loaded.get_config() == model.get_config()
    assert sorted(v.path for v in loaded.weights) == sorted(v.path for v in model.weights)
    np.testing.assert_allclose(logits(loaded, batch), logits(model, batch), atol=1e-6)


def test_forward_intermediates_of_patch_sequences_are_sequences():
    model = random_vit(pooling="gap")
    batch = naflex.patch_sequences(_images(), 4, 64)
    final, blocks = model.forward_intermediates(batch, indices=1, output_format="NLC", norm=True)
    assert to_numpy(final).shape == (4, 64, 48) and to_numpy(blocks[0]).shape == (4, 64, 48)
    np.testing.assert_allclose(to_numpy(blocks[0]), to_numpy(final), atol=1e-5)  # the last block, normed
    with pytest.raises(ValueError, match="output_format='NHWC' needs one grid.*use 'NLC'"):
        model.forward_intermediates(batch, output_format="NHWC")


@pytest.mark.slow  # compiles a training step: a minute on JAX on a busy 2-core machine
def test_fit_on_patch_sequences_trains_as_on_images():
    """`model.fit` on patch sequences: at the table's grid, the very steps of training on the images;
    on a batch mixing aspect ratios, the loss falls."""
    labels = keras.utils.to_categorical([0, 1, 2, 3], 5)
    square = _images([(32, 32)] * 4)
    losses = []
    for inputs in (np.stack([(i / 255.0 - 0.5) / 0.5 for i in square]), naflex.patch_sequences(square, 4, 64),
                   naflex.patch_sequences(_images(), 4, 64)):
        keras.utils.set_random_seed(0)
        model = tiny_vit(pooling="gap")
        loss = keras.losses.CategoricalCrossentropy(from_logits=True)
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss)
        losses.append(model.fit(inputs, labels, batch_size=4, epochs=6, verbose=0).history["loss"])
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-4)
    assert losses[2][-1] < 0.5 * losses[2][0]


def _bad(batch, **changes):
    return {**batch, **{k: np.asarray(v) for k, v in changes.items()}}


def test_bad_patch_sequences_get_one_line():
    model = tiny_vit()
    batch = naflex.patch_sequences(_images(), 4, 64)
    coord, valid = batch["patch_coord"].copy(), batch["patch_valid"].copy()
    far, empty, negative = coord.copy(), valid.copy(), coord.copy()
    far[1, 0] = (30, 1)  # a coordinate beyond the 4 x 12 grid of image 1
    empty[2] = False
    negative[0, 3] = (-1, 0)
    cases = [
        (_bad(batch, patch_coord=far), "patch_coord of image 1 reaches row 30, column 11, a 31 x 12 grid of 372 "
                                       "patches, but the image has 48 valid tokens"),
        (_bad(batch, patch_valid=empty), "patch_valid of image 2 has no valid token"),
        (_bad(batch, patch_coord=negative), "patch_coord of image 0 holds -1"),
        (_bad(batch, patches=batch["patches"][..., :47]), r"patches have shape \(4, 64, 47\), but this model takes "
                                                          r"\(B, L, 48\): P \* P \* C = 4 \* 4 \* 3"),
        ({k: batch[k] for k in ("patches", "patch_valid")}, "patch sequences are a dict with the keys"),
    ]
    for inputs, message in cases:
        with pytest.raises(ValueError, match=message) as e:
            model(inputs)
        assert "\n" not in str(e.value)
    for budget in (0, -3, 2.5):
        with pytest.raises(ValueError, match=f"max_seq_len={budget!r} is smaller than one patch"):
            naflex.patch_sequences(_images(), 4, budget)
    with pytest.raises(ValueError, match="max_seq_len=0 is smaller than one patch"):
        tiny_vit(max_seq_len=0)
    for shape in ((18, 16, 3), (32, 36, 3)):  # not a grid of 4 px patches; 8 x 9 patches over 64
        with pytest.raises(ValueError, match=f"an image of {shape[0]} x {shape[1]} pixels is not a grid of 4 px "
                                             "patches within max_seq_len=64; resize it with resize_to_budget"):
            naflex.pack([np.zeros(shape, "float32")], 4, 64)
    resized = [naflex.resize_to_budget(image, 4, 64) for image in _images()]
    packed, made = naflex.pack(resized, 4, 64), naflex.patch_sequences(_images(), 4, 64)
    for key in naflex.KEYS:
        np.testing.assert_array_equal(packed[key], made[key])


def test_resize_resamples_factorized_tables_as_a_call_at_another_grid_does():
    import keras_vit

    model = random_vit(position_embedding="factorized", dynamic_image_size=True)
    big = keras_vit.resize(model, (48, 24))
    assert tuple(big.position_embedding.rows.shape) == (1, 12, 48)
    x = np.random.default_rng(0).normal(size=(1, 48, 24, 3)).astype("float32")
    np.testing.assert_allclose(logits(big, x), logits(model, x), atol=2e-5)
