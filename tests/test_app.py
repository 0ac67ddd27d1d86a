"""Unit tests of the demo's pure parts: image loading, preprocessing, `predict`, checkpoints, CLI."""

import types

import numpy as np
import pytest
from conftest import to_numpy
from PIL import Image

from apps.checkpoint import DEFAULT_CHECKPOINT, class_labels, load_model
from apps.inference import OVERLAY_SIZE, Predictor, blend
from apps.preprocess import fashion_mnist_style, model_pixels
from keras_vit.io import images
from keras_vit.io.images import ImageRejected, open_image
from test_app_helpers import NAMES, garment, noise, png_header_only, save, tiny_classifier, truncated_png


def image_kinds(d):
    """One file per Pillow mode and container the app must accept."""
    rgb = Image.fromarray(noise())
    rgba = rgb.convert("RGBA")
    rgba.putalpha(128)
    p_trans = rgb.convert("P", palette=Image.Palette.ADAPTIVE)
    p_trans.info["transparency"] = 0
    gradient16 = np.linspace(0, 65535, 40 * 48).reshape(40, 48).astype("uint16")
    return {
        "RGB.jpg": save(rgb, d / "rgb.jpg"),
        "L.png": save(garment(), d / "l.png"),
        "RGBA.png": save(rgba, d / "rgba.png"),
        "LA.png": save(garment().convert("LA"), d / "la.png"),
        "P-transparency.png": save(p_trans, d / "p.png", transparency=0),
        "P.gif": save(rgb.convert("P"), d / "p.gif"),
        "CMYK.jpg": save(rgb.convert("CMYK"), d / "cmyk.jpg"),
        "I;16.png": save(Image.fromarray(gradient16), d / "i16.png"),
        "I.tif": save(Image.fromarray(gradient16.astype("int32"), "I"), d / "i.tif"),
        "F.tif": save(Image.fromarray(gradient16.astype("float32") / 65535, "F"), d / "f.tif"),
        "1.png": save(garment().convert("1"), d / "one.png"),
        "RGB.webp": save(rgb, d / "rgb.webp"),
        "1x1.png": save(Image.new("RGB", (1, 1), (200, 10, 10)), d / "tiny.png"),
        "10000x10.png": save(Image.new("L", (10000, 10), 90), d / "wide.png"),
    }


@pytest.fixture(scope="module")
def predictors():
    # The one-channel model pools by GAP, like the shipped Fashion-MNIST model: no class token.
    return {1: Predictor(tiny_classifier(1, pooling="gap"), NAMES), 3: Predictor(tiny_classifier(3), NAMES)}


@pytest.mark.parametrize("channels", [1, 3])
def test_predict_on_every_image_kind(predictors, tmp_path, channels):
    for kind, path in image_kinds(tmp_path).items():
        labels, overlay, per_head = predictors[channels].predict(path)
        assert len(labels) == 5 and set(labels) <= set(NAMES), kind
        assert 0.0 < sum(labels.values()) <= 1.0 + 1e-5, kind
        assert overlay.dtype == np.uint8 and overlay.shape == (384, 384, 3), kind
        assert len(per_head) == 3 and per_head[0][0].shape == (160, 160, 3), kind


def test_sixteen_bit_images_are_scaled_not_saturated(tmp_path):
    gradient16 = np.linspace(0, 65535, 256 * 4).reshape(4, 256).astype("uint16")
    for path in (save(Image.fromarray(gradient16), tmp_path / "a.png"), save(Image.fromarray(gradient16.astype("int32"), "I"), tmp_path / "a.tif")):
        a = np.asarray(open_image(path))
        assert a.min() == 0 and a.max() == 255
        assert 120 <= np.median(a) <= 135  # Pillow's own convert("L") would clip most of it to 255


def test_transparency_is_composited_on_white(tmp_path):
    clear = Image.new("RGBA", (8, 8), (255, 0, 0, 0))
    assert np.asarray(open_image(save(clear, tmp_path / "c.png"))).min() == 255


def test_exif_orientation_is_applied(tmp_path):
    a = np.zeros((20, 40, 3), "uint8")
    a[:, :20] = 255  # the left half is white
    exif = Image.Exif()
    exif[0x0112] = 6  # stored rotated: display it turned 90 degrees clockwise
    path = save(Image.fromarray(a), tmp_path / "o.jpg", exif=exif, quality=95)
    im = np.asarray(open_image(path).convert("L"))
    assert im.shape == (40, 20)
    assert im[:20].mean() > 200 and im[20:].mean() < 50  # the white half is now on top


def test_huge_jpeg_is_decoded_small(tmp_path):
    path = save(Image.new("RGB", (8000, 6000), (10, 200, 30)), tmp_path / "big.jpg", quality=50)
    im = Image.open(path)
    assert im.size == (8000, 6000)
    out = open_image(path)
    assert max(out.size) == images.MAX_SIDE


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("empty.png", b"", "not an image"),
        ("text.png", b"hello, I am not an image\n" * 10, "not an image"),
        ("bomb-60mp.png", png_header_only(8000, 7500), "accepts images of up to 50 MP"),
        ("bomb-400mp.png", png_header_only(20000, 20000), "decompression-bomb limit"),
    ],
)
def test_hostile_files_are_refused_with_a_message(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ImageRejected, match=message):
        open_image(path)


def test_truncated_file_is_refused(tmp_path):
    with pytest.raises(ImageRejected, match="damaged or truncated"):
        open_image(truncated_png(tmp_path / "t.png"))


def test_fashion_style_inverts_light_backgrounds_and_centers():
    light = fashion_mnist_style(garment(light_background=True))
    dark = fashion_mnist_style(garment(light_background=False))
    for im in (light, dark):
        a = np.asarray(im)
        assert a.shape[0] == a.shape[1]  # padded to a square
        assert a[:, 0].max() == 0 and a[:, -1].max() == 0  # black background left and right
        assert a[a.shape[0] // 2, a.shape[1] // 2] == 255  # the garment is bright and centered
    pixels = model_pixels(garment(), (32, 32), 1, fashion_style=False)
    assert pixels.shape == (32, 32, 1) and pixels[0, 0, 0] > 200  # off: left as it is


@pytest.mark.parametrize("channels", [1, 3])
def test_predict_views_and_bad_arguments(predictors, tmp_path, channels):
    path = save(Image.fromarray(noise()), tmp_path / "x.png")
    p = predictors[channels]
    a = p.predict(path, view="rollout")[1]
    b = p.predict(path, view="class-token attention", layer=0, head="2", opacity=0.7)[1]
    assert not np.array_equal(a, b)
    assert np.array_equal(p.predict(path, opacity=0.0)[1], p.predict(path, view="class-token attention", opacity=0.0)[1])
    for kwargs, match in [({"view": "gradcam"}, "view="), ({"layer": 2}, "layer=2"), ({"head": 3}, "head=3"), ({"opacity": 2}, "opacity=2")]:
        with pytest.raises(ValueError, match=match):
            p.predict(path, **kwargs)


def full_map_heat(model, maps, layer, head):
    """The (h, w) class-token map the app drew from full (K, T, T) maps before it kept only rows."""
    p = model.num_prefix_tokens
    a = maps[layer].mean(axis=0) if head == "mean" else maps[layer, head]  # (T, T)
    row = a[0, p:] if model.class_token else a[p:, p:].mean(axis=0)
    return row.reshape(model.grid_size)


@pytest.mark.parametrize("channels", [1, 3])
def test_cache_keeps_rows_and_rollout_and_overlays_equal_the_full_maps(predictors, tmp_path, channels):
    import keras_vit

    p = predictors[channels]
    model = p.model
    path = save(Image.fromarray(noise(seed=5)), tmp_path / "c.png")
    labels = p.predict(path)[0]
    (pixels, logits, rows, rollout), ran_model = p._forward_cached(path, True)
    tokens = model.num_prefix_tokens + 8 * 8
    assert not ran_model and logits.shape == (1, 10)
    assert rows.shape == (1, 2, 3, tokens) and rollout.shape == (1, 8, 8)  # not (1, L, K, T, T)
    # The computation from full maps, as the app did before.
    x = model.normalize(pixels[None])
    maps = to_numpy(keras_vit.attention_maps(model, x))  # (1, L, K, T, T)
    full_rollout = to_numpy(keras_vit.attention_rollout(model, None, maps=maps))[0]
    np.testing.assert_allclose(rollout[0], full_rollout, atol=1e-6)
    for layer in range(2):
        for head in ("mean", 0, 1, 2):
            np.testing.assert_allclose(p.class_token_map(rows[0, layer], head), full_map_heat(model, maps[0], layer, head),
                                       atol=1e-6)
    features = model.forward_features(x, training=False)
    np.testing.assert_allclose(logits, to_numpy(model.head(features)), atol=1e-5)
    assert list(labels) == [NAMES[i] for i in np.argsort(-logits[0])[:5]]
    for view, heat in (("rollout", full_rollout), ("class-token attention", full_map_heat(model, maps[0], 1, "mean"))):
        overlay = p.predict(path, view=view, layer=1, opacity=0.6)[1]
        expected = blend(pixels, heat, 0.6, OVERLAY_SIZE)
        # The min-max scaled maps agree to 1e-6; a colormap bin may still flip at a few pixels.
        diff = np.abs(overlay.astype(int) - expected.astype(int))
        assert diff.max() <= 8 and (diff > 0).mean() < 0.01


def test_keras_checkpoint_and_labels(tmp_path):
    model = tiny_classifier()
    path = tmp_path / "m.keras"
    model.save(path)
    loaded = load_model(path)
    assert class_labels(loaded) == NAMES
    (tmp_path / "labels.txt").write_text("\n".join(f"n{i}" for i in range(10)))
    assert class_labels(loaded, tmp_path / "labels.txt")[3] == "n3"
    (tmp_path / "short.txt").write_text("a\nb\n")
    with pytest.raises(ValueError, match="has 2 labels but the model has num_classes=10"):
        class_labels(loaded, tmp_path / "short.txt")
    with pytest.raises(ValueError, match="cannot load"):
        load_model(save(Image.new("L", (2, 2)), tmp_path / "m.png"))


def test_imagenet_names_for_1000_classes():
    head_1000 = types.SimpleNamespace(num_classes=1000, class_names=None)  # all class_labels reads
    labels = class_labels(head_1000)
    assert len(labels) == 1000 and labels[0] == "tench" and labels[1] == "goldfish"


def test_cli_without_checkpoint_says_how_to_get_one(tmp_path, capsys):
    from apps import demo

    missing = tmp_path / "nope.keras"
    with pytest.raises(SystemExit) as exit_info:
        demo.main(["--checkpoint", str(missing)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "no checkpoint at" in err and "nope.keras" in err
    args = demo.parse_args([])
    assert (args.host, args.port, args.share, args.checkpoint) == ("127.0.0.1", 7860, False, str(DEFAULT_CHECKPOINT))
    if not DEFAULT_CHECKPOINT.exists():
        with pytest.raises(SystemExit):
            demo.main([])
        assert "training CLI" in capsys.readouterr().err


@pytest.mark.parametrize("choice, restarts", [("auto", True), ("system", False)])
def test_cli_restarts_with_the_allocator_before_loading_the_model(tmp_path, choice, restarts):
    import os
    import subprocess
    import sys

    from training import malloc

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = malloc.environ("system", {**os.environ, "PYTHONPATH": root})
    verbose = ["--verbose"] if restarts else []  # without it the demo prints only its own line
    out = subprocess.run([sys.executable, "-m", "apps.demo", "--malloc", choice, "--checkpoint", str(tmp_path / "x.keras"),
                          *verbose], env=env, cwd=root, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "no checkpoint at" in out.stderr  # the restarted process ran main
    assert ("malloc: restarting with tcmalloc" in out.stderr) == restarts
    if not verbose:  # one line, no traceback, no library logs
        assert out.stderr.startswith("python -m apps.demo: error: no checkpoint at") and out.stderr.count("\n") == 1


def test_timm_safetensors_checkpoint_is_served(tmp_path):
    import keras_vit

    model = tiny_classifier()
    keras_vit.save_checkpoint(model, tmp_path / "m.safetensors")
    loaded = load_model(tmp_path / "m.safetensors")
    assert class_labels(loaded) == NAMES
    path = save(Image.fromarray(noise()), tmp_path / "x.png")
    assert Predictor(model, NAMES).predict(path)[0] == pytest.approx(Predictor(loaded, NAMES).predict(path)[0], abs=1e-5)


def test_corrupt_chunks_and_animations(tmp_path):
    frames = [Image.fromarray(noise(seed=s)) for s in range(3)]
    gif = save(frames[0], tmp_path / "anim.gif", save_all=True, append_images=frames[1:])
    assert open_image(gif).size == (48, 40)  # the first frame
    png = png_header_only(8, 8)
    bad_crc = png[:29] + b"\0\0\0\0" + png[33:]  # the IHDR checksum is wrong
    (tmp_path / "crc.png").write_bytes(bad_crc)
    with pytest.raises(ImageRejected):
        open_image(tmp_path / "crc.png")


def test_shipped_checkpoint_on_the_examples():
    from apps.demo import example_images
    from apps.make_examples import slug

    model = load_model(DEFAULT_CHECKPOINT)
    predictor = Predictor(model, class_labels(model))
    right = {}
    for path in example_images():
        top = next(iter(predictor.predict(path)[0]))
        right[path.name] = path.stem.endswith(slug(top))
    print(f"\nshipped checkpoint: {sum(right.values())} of {len(right)} examples right: {right}")
    assert sum(right.values()) >= 0.7 * len(right)  # ~90% test accuracy expected; 22 images


@pytest.mark.slow
def test_fashion_style_preprocessing_is_harmless_on_fashion_mnist_itself():
    from training.datasets.fashion_mnist import find_files, read_idx

    model = load_model(DEFAULT_CHECKPOINT)
    predictor = Predictor(model, class_labels(model))
    files = find_files()
    images, labels = read_idx(files["test_data"])[:1000], read_idx(files["test_labels"])[:1000]
    accuracy = {}
    for style in (True, False):
        pixels = np.stack([model_pixels(Image.fromarray(a), model.image_size, 1, style) for a in images])
        accuracy[style] = float((predictor.forward(pixels)[0].argmax(-1) == labels).mean())
    print(f"\naccuracy on 1000 test images: Fashion-MNIST-style {accuracy[True]:.3f}, as is {accuracy[False]:.3f}")
    assert accuracy[True] >= accuracy[False] - 0.03


@pytest.mark.slow
def test_demo_prints_one_startup_line_and_no_library_logs(tmp_path):
    import os
    import subprocess
    import sys

    from test_app_helpers import free_port

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_CPP", "KERAS_BACKEND"))}
    proc = subprocess.Popen([sys.executable, "-m", "apps.demo", "--port", str(port)], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
    finally:
        proc.terminate()
        rest, err = proc.communicate(timeout=60)
    assert line.startswith(f"python -m apps.demo: serving {DEFAULT_CHECKPOINT} on jax: 10 classes (T-shirt/top, ")
    assert "28 x 28 px, 1 channel(s)" in line and f"http://127.0.0.1:{port}" in line
    assert rest == "" and err == ""  # no TensorFlow, CUDA or Gradio lines, no share=True hint


def test_settings_reuse_the_forward_pass_of_the_same_file(predictors, tmp_path):
    p = predictors[1]
    path = save(Image.fromarray(noise(seed=3)), tmp_path / "a.png")
    first = p.explain(path, view="rollout")
    again = p.explain(path, view="class-token attention", layer=0, head=1, opacity=0.3)
    assert first[3] and not again[3] and first[0] == again[0]  # same classes, model not rerun
    assert [c for _, c in again[2]] == ["layer 1 head 1", "layer 1 head 2", "layer 1 head 3"]
    assert p.explain(path, fashion_style=False)[3]  # other preprocessing: the model runs
    save(Image.fromarray(noise(seed=4)), path)  # the file changed: the model runs
    assert p.explain(path)[3]
