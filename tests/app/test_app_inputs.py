"""One photo, one model input: real photos (scikit-image's and scikit-learn's samples, as PNG and
JPEG files of several sizes) give identical arrays through the training pipeline (a folder
dataset, `training.datasets.pipeline`), the demo (`apps.images.model_pixels` and `ViT.normalize`,
as `apps.inference.Predictor` feeds the model) and the exported artifact's prologue
(`keras_vit.export.ServingModel`, fed the demo's uint8 pixels)."""

import numpy as np
import pytest
from PIL import Image
from tests.conftest import random_vit, to_numpy

from apps.images import model_pixels
from keras_vit.export import ServingModel
from keras_vit.io.images import open_image

PHOTOS = {"astronaut": (512, 512), "chelsea": (180, 270), "coffee": (61, 97), "rocket": (427, 640)}
RECORDS = [dict(image_resize="bilinear", image_antialias=False, image_crop="center"),  # older files' record
           dict(image_resize="bicubic", image_antialias=True, image_crop="none"),
           dict(image_resize="lanczos", image_antialias=True, image_crop="pad")]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """root/<photo>/<photo>.{png,jpg}, each photo at its size of PHOTOS."""
    import skimage.data
    from sklearn.datasets import load_sample_image

    root = tmp_path_factory.mktemp("photos")
    pictures = {name: Image.fromarray(getattr(skimage.data, name)()) for name in PHOTOS}
    for name, (h, w) in PHOTOS.items():
        (root / name).mkdir()
        picture = pictures[name].resize((w, h), Image.Resampling.BICUBIC)
        picture.save(root / name / f"{name}.png")
        picture.save(root / name / f"{name}.jpg", quality=90)
    (root / "china").mkdir()
    Image.fromarray(load_sample_image("china.jpg")).save(root / "china" / "china.jpg", quality=95)  # 427 x 640
    return root


@pytest.mark.one_backend  # TensorFlow's pipeline and Pillow; the model's normalization runs on the first backend
@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r["image_resize"])
def test_a_photo_gives_identical_inputs_through_training_the_demo_and_the_export(folder, record):
    from training import datasets

    model = random_vit(num_classes=len(PHOTOS) + 1, **record)
    raw, info = datasets.load(str(folder), "all", seed=0)
    batches = datasets.pipeline(raw, info, model.preprocessing, 64, False, cache=False)
    trained = np.concatenate([x for x, _ in batches.as_numpy_iterator()])
    paths = sorted(p for p in folder.rglob("*") if p.is_file())  # the folder's order: class, then file
    pixels = np.stack([model_pixels(open_image(p), model.preprocessing) for p in paths])  # the demo's uint8
    shown = to_numpy(model.normalize(pixels))
    exported = to_numpy(ServingModel(model).inputs(pixels))
    assert trained.shape == (len(paths), 32, 32, 3) and pixels.dtype == np.uint8
    np.testing.assert_array_equal(trained, shown)
    np.testing.assert_array_equal(trained, exported)
    raw_pixels = datasets.pipeline(raw, info, model.preprocessing, 64, False, cache=False, normalize=False)
    np.testing.assert_array_equal(np.concatenate([x for x, _ in raw_pixels.as_numpy_iterator()]), pixels)
