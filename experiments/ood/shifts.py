"""The images of the out-of-domain studies (`python -m experiments.ood`, `python -m
experiments.ood.sample_size`): Fashion-MNIST, its near shifts, far shifts (digits, photos, noise,
flat images), and the AUROC and FPR at 95% TPR that score them.

Shapes: N images, H x W x C pixels of the model, uint8.
"""

import os

import numpy as np

# scikit-image's sample photos that ship in its wheel (no download), and scikit-learn's two.
SKIMAGE_PHOTOS = ("astronaut", "camera", "chelsea", "coffee", "coins", "moon", "page", "rocket", "text", "clock",
                  "brick", "grass", "gravel", "hubble_deep_field", "immunohistochemistry", "retina", "horse")
CROPS_PER_PHOTO = 100
NOISE_IMAGES = 500  # of each kind: uniform and Gaussian
SHIFTED_IMAGES = 2000  # test images per near shift


def photos():
    """{name: PIL image} of the sample photos."""
    import skimage.data
    from PIL import Image
    from sklearn.datasets import load_sample_images

    found = {}
    for name in SKIMAGE_PHOTOS:
        pixels = getattr(skimage.data, name)()
        if pixels.dtype == bool:  # "horse" is a silhouette: black on white
            pixels = np.where(pixels, 0, 255).astype("uint8")
        found[name] = Image.fromarray(pixels)
    samples = load_sample_images()
    for path, pixels in zip(samples.filenames, samples.images):
        found[os.path.basename(path)] = Image.fromarray(pixels)
    return found


def crops(images, per_image, rng):
    """`per_image` random square crops of each PIL image, from a quarter to all of its short side,
    each flipped left-right or upside down at random and recoloured: channels shuffled, brightness
    and contrast scaled by 0.6 to 1.4."""
    from PIL import Image, ImageEnhance

    out = []
    for im in images:
        im = im.convert("RGB")
        w, h = im.size
        for _ in range(per_image):
            side = int(rng.uniform(0.25, 1.0) * min(w, h))
            x, y = rng.integers(0, w - side + 1), rng.integers(0, h - side + 1)
            crop = im.crop((x, y, x + side, y + side))
            if rng.random() < 0.5:
                crop = crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            if rng.random() < 0.25:
                crop = crop.transpose(Image.Transpose.FLIP_TOP_BOTTOM)
            crop = Image.merge("RGB", [crop.split()[i] for i in rng.permutation(3)])
            crop = ImageEnhance.Brightness(crop).enhance(rng.uniform(0.6, 1.4))
            out.append(ImageEnhance.Contrast(crop).enhance(rng.uniform(0.6, 1.4)))
    return out


def digits():
    """scikit-learn's 1,797 handwritten digits (8 x 8, values 0-16) as 8-bit grayscale PIL images."""
    from PIL import Image
    from sklearn.datasets import load_digits

    return [Image.fromarray((d * 255 / 16).round().astype("uint8")) for d in load_digits().images]


def for_model(gray, model):
    """Fashion-MNIST-like images (N, 28, 28) uint8 -> (N, H, W, C) for `model`: a three-channel model
    (one trained on a folder of PNGs) gets the grey level in each channel."""
    if tuple(model.image_size) != gray.shape[1:3]:
        raise ValueError(f"the model takes {model.image_size} images; the out-of-domain studies measure models of "
                         "28 x 28 Fashion-MNIST")
    return np.repeat(gray[..., None], model.num_channels, axis=-1)


def near_shifts(model, test, rng):
    """{name: pixels} of the test images (N, 28, 28) uint8 shifted a little, for `model`."""
    from PIL import Image, ImageFilter

    from apps.images import model_pixels

    pick = test[rng.choice(len(test), min(SHIFTED_IMAGES, len(test)), replace=False)]
    blurred = np.stack([np.asarray(Image.fromarray(t).filter(ImageFilter.GaussianBlur(1.5))) for t in pick])
    photo = lambda t: Image.fromarray(255 - t).resize((112, 112), Image.Resampling.BICUBIC)  # noqa: E731
    return {
        "blurred (Gaussian, 1.5 px)": for_model(blurred, model),
        "low contrast (35%)": for_model((pick * 0.35 + 60).astype("uint8"), model),
        "inverted": for_model(255 - pick, model),
        "as product photos, no Fashion-MNIST-style preprocessing": np.stack(
            [model_pixels(photo(t), model.image_size, model.num_channels, False) for t in pick]),
    }


def far_shifts(model, rng):
    """{name: pixels (N, H, W, C) uint8}, prepared as the demo prepares uploads."""
    from apps.images import model_pixels

    prep = lambda ims, fashion: np.stack([model_pixels(im, model.image_size, model.num_channels, fashion)  # noqa: E731
                                          for im in ims])
    shots = list(photos().values())
    cut = crops(shots, CROPS_PER_PHOTO, rng)
    shape = (NOISE_IMAGES, *model.image_size, model.num_channels)
    noise = np.concatenate([rng.integers(0, 256, shape), np.clip(rng.normal(128, 64, shape), 0, 255)]).astype("uint8")
    flat = np.broadcast_to(np.arange(256, dtype="uint8")[:, None, None, None], (256, *shape[1:])).copy()
    return {
        "digits (scikit-learn, upscaled)": prep(digits(), False),
        "photos (whole)": prep(shots, True),
        "photo crops, flipped and recoloured": prep(cut, True),
        "the same crops, no Fashion-MNIST-style preprocessing": prep(cut, False),
        "noise (uniform, Gaussian)": noise,
        "flat images (every grey level)": flat,
    }


def rocket(model):
    """scikit-image's rocket photo as the demo prepares it: (1, H, W, C) uint8."""
    import skimage.data
    from PIL import Image

    from apps.images import model_pixels

    fashion = model.num_channels == 1
    return model_pixels(Image.fromarray(skimage.data.rocket()), model.image_size, model.num_channels, fashion)[None]


def auroc(inside, outside):
    """Area under the ROC curve of telling `outside` scores from `inside` ones (higher: outside)."""
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(np.r_[np.zeros(len(inside)), np.ones(len(outside))], np.r_[inside, outside]))


def fpr_at_95(inside, outside):
    """The share of `outside` scores at or below the 95th percentile of `inside` (FPR at 95% TPR,
    in-domain images the positives): the shifted images that a 5% false-alarm threshold misses."""
    return float(np.mean(np.asarray(outside) <= np.quantile(inside, 0.95)))
