"""One way in, one description of the input, read from the source with `ast`: outside
`keras_vit.load` (keras_vit/checkpoints/__init__.py) no code turns a file into a model, and outside
`keras_vit.Preprocessing` (keras_vit/preprocessing.py) no code resizes an image or normalizes
pixels. The places that do either for another purpose are listed with the reason, by function."""

import ast
import os

import pytest
from tests import ROOT

pytestmark = pytest.mark.one_backend  # the same on every backend: scripts/test runs it once

PACKAGES = ("keras_vit", "commands", "training", "apps", "benchmarks", "experiments", "scripts")
# Calls that make a model from a file or its description, by the end of their dotted name (a name
# imported with `from ... import` counts under its module's name).
LOADERS = ("saving.load_model", "models.load_model", "deserialize_keras_object", "model_from_json", "formats.detect",
           "hub.locate", "hub.fetch")
# Calls that resize an image (Pillow's, Keras', TensorFlow's, JAX's), by the end of their dotted name;
# `keras_vit.resize` resizes a model.
RESIZERS = ("resize", "thumbnail", "transform", "Resizing", "resize_with_pad", "resize_with_crop_or_pad",
            "scale_and_translate", "ImageOps.fit", "ImageOps.pad", "ImageOps.contain", "ImageOps.cover")
NOT_IMAGES = ("keras_vit.resize",)
# Divisions that scale 8-bit pixels: x / 255, x / 127.5 - 1; and the model's own normalization.
PIXEL_SCALES = {255, 255.0, 127.5}
NORMALIZATION = {"image_mean", "image_std"}

# NaFlex patch sequences (keras_vit.naflex) are made at each image's own size.
NAFLEX = ("scales each image to its own token budget at its aspect ratio with timm's NaFlex filter (antialiased "
          "bicubic), sizes that a fixed-size Preprocessing does not describe; the model's image_mean and image_std "
          "normalize it")
THE_LOADER = "keras_vit/checkpoints/__init__.py"
THE_PREPROCESSOR = "keras_vit/preprocessing.py"
# (path, function): why it may make a model, or resize or normalize pixels, without being the one way.
ALLOWED = {
    ("training/checkpointing.py", "load_model"): "restores a run's sharded Orbax state in the run's distribution; "
                                                 "training.export_checkpoint writes it as a file for keras_vit.load",
    ("keras_vit/models/backbone.py", "ViTFeatures"): "rebuilds the ViT it shares from its own config",
    ("keras_vit/models/quantization.py", "apply"): "rebuilds a layer's quantization config",
    ("keras_vit/checkpoints/transformers.py", "write"): "writes transformers' rescale factor, 1 / 255",
    ("keras_vit/io/images.py", "_decode"): "caps an image's side at MAX_SIDE while decoding (open_image), for "
                                           "training and the demo alike, before Preprocessing.prepare",
    ("training/examples.py", "save"): "stores the held-out examples at most MAX_SIDE px, files for the gallery",
    ("apps/images.py", "blend"): "draws the map over the image as the page shows it, not the model's input",
    ("benchmarks/impls.py", "_timm_artifact"): "feeds timm, the reference, its own normalization",
    ("scripts/make_examples.py", "main"): "draws the photo-style example images",
    ("keras_vit/hub/hf.py", "fetch"): "asks which files a Hub repo's checkpoint needs, to download only those",
    ("training/datasets/digits.py", "images"): "makes the dataset: scikit-learn's 8 x 8 digits at 28 x 28",
    ("experiments/ood/shifts.py", "near_shifts"): "makes the product-photo shift of the study's test images",
    ("experiments/preprocessing_skew.py", "shipped"): "makes larger copies of the study's test images",
    ("experiments/ood/far_shift.py", "image_sets"): "makes the product-photo shift of the study's test images",
    ("experiments/best_epoch.py", "variant"): "makes the study's photo crops",
    ("experiments/best_epoch.py", "write_photos"): "makes the study's source photos",
    ("keras_vit/naflex.py", "pack"): NAFLEX,
    ("keras_vit/naflex.py", "patch_sequence"): NAFLEX,
    ("training/datasets/naflex.py", "pipeline"): NAFLEX,
    ("experiments/naflex_aspect.py", "square_inputs"): "makes the study's square and bucket baselines, "
                                                      "resized like its NaFlex inputs, to compare with them",
}


def _functions(tree):
    """{node: name of the outermost function or class around it} for every node of `tree`."""
    owner = {}
    for top in tree.body:
        name = getattr(top, "name", None)
        for node in ast.walk(top):
            owner[node] = name
    return owner


def _called(node, imported):
    """The dotted name of a call: "keras.saving.load_model", "im.resize", "?.resize" (on a call's
    result); a name that `imported` maps ({name: "module.name"}) is given by its module."""
    parts, func = [], node.func
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    parts.append(imported.get(func.id, func.id) if isinstance(func, ast.Name) else "?")
    return ".".join(reversed(parts))


def _imported(tree):
    """{name: "module.name"} of the `from module import name` statements of `tree`."""
    return {a.asname or a.name: f"{node.module}.{a.name}" for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module for a in node.names}


def _matches(dotted, names):
    return dotted not in NOT_IMAGES and any(dotted == n or dotted.endswith("." + n) for n in names)


def _scales_pixels(node):
    """x / 255 or x / 127.5; or arithmetic on a model's image_mean / image_std."""
    if not isinstance(node, ast.BinOp):
        return False
    sides = (node.left, node.right)
    divides = isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant) and node.right.value in PIXEL_SCALES
    return divides or any(isinstance(side, ast.Attribute) and side.attr in NORMALIZATION for side in sides)


def findings(root=ROOT, packages=PACKAGES, allowed=ALLOWED):
    """["path:line: function does what"] of every place outside the one loader and the one
    preprocessor that makes a model, resizes an image or normalizes pixels, but those `allowed`."""
    return [f"{rel}:{line}: {owner} {what}" for rel, line, owner, what in _places(root, packages)
            if (rel, owner) not in allowed]


def _places(root, packages):
    found = []
    for package in packages:
        for folder, _, files in os.walk(os.path.join(root, package)):
            for file in sorted(f for f in files if f.endswith(".py")):
                path = os.path.join(folder, file)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                with open(path, encoding="utf-8") as f:
                    tree = ast.parse(f.read(), path)
                owner, imported = _functions(tree), _imported(tree)
                for node in ast.walk(tree):
                    what, called = None, _called(node, imported) if isinstance(node, ast.Call) else ""
                    if _matches(called, LOADERS) and rel != THE_LOADER:
                        what = f"makes a model ({called})"
                    elif _matches(called, RESIZERS) and rel != THE_PREPROCESSOR:
                        what = f"resizes an image ({called})"
                    elif _scales_pixels(node) and rel != THE_PREPROCESSOR:
                        what = "normalizes pixels"
                    if what:
                        found.append((rel, node.lineno, owner.get(node), what))
    return found


def test_one_function_makes_models_and_one_record_prepares_images():
    bad = findings()
    assert not bad, ("call keras_vit.load for a model and keras_vit.Preprocessing (a model's .preprocessing) for its "
                     "input, or list the place in ALLOWED with why:\n" + "\n".join(bad))


def test_every_allowed_place_still_does_what_it_is_allowed():
    places = {(rel, owner) for rel, _, owner, _ in _places(ROOT, PACKAGES)}
    assert not set(ALLOWED) - places, f"ALLOWED lists places that no longer need it: {set(ALLOWED) - places}"


def test_a_second_loader_or_resize_or_normalization_is_caught(tmp_path):
    (tmp_path / "apps").mkdir()
    (tmp_path / "apps" / "mine.py").write_text(
        "import keras\n"
        "def my_loader(path):\n    return keras.saving.load_model(path)\n"
        "def my_resize(im):\n    return im.resize((224, 224))\n"
        "def my_normalize(x):\n    return x / 255.0 - 0.5\n")
    assert findings(tmp_path, ("apps",)) == ["apps/mine.py:3: my_loader makes a model (keras.saving.load_model)",
                                             "apps/mine.py:5: my_resize resizes an image (im.resize)",
                                             "apps/mine.py:7: my_normalize normalizes pixels"]
