"""How an image becomes a model's input, as data saved with the model: `Preprocessing`.

A ViT records how its training images were prepared (`ViT.preprocessing`, from its `image_size`,
`image_mean`, `image_std`, `image_resize`, `image_antialias`, `image_crop` and `num_channels`), and
every path from an image to the model reads that record through the two functions here:

- `Preprocessing.prepare`: a Pillow image of any mode and size -> uint8 pixels (H, W, C) at the
  model's size: the channels by Pillow's "L" or "RGB" conversion, then one Pillow resize of the
  crop. The training pipeline calls it through `tf.numpy_function`, and the demo calls it directly,
  so that one photo gives the same pixels in both; an exported artifact takes these uint8 pixels.
- `Preprocessing.normalize`: pixels in [0, 255] -> (pixels / 255 - mean) / std, float32, in
  `keras.ops` (the model, the demo, the export's prologue) or in TensorFlow (the tf.data pipeline).

Shapes: H x W the model's input size, h x w an image's size, C channels (1 or 3).
"""

import dataclasses

import numpy as np
from PIL import Image

# The resize filters, by the names of keras-hub's image converter and timm's pretrained_cfg.
RESIZE = {"nearest": Image.Resampling.NEAREST, "bilinear": Image.Resampling.BILINEAR,
          "bicubic": Image.Resampling.BICUBIC, "lanczos": Image.Resampling.LANCZOS, "box": Image.Resampling.BOX}
# "center": the largest centered box of the target's aspect ratio, resized (timm's and keras-hub's
# crop_to_aspect_ratio); "none": the whole image, resized to the target's shape (transformers'
# ViTImageProcessor); "pad": the whole image, resized to fit and centered on black.
CROPS = ("center", "none", "pad")


@dataclasses.dataclass(frozen=True)
class Preprocessing:
    """How a model's images are prepared: the one description of the input.

    Attributes:
        image_size: (H, W) of the model's input.
        mean: per-channel mean of pixels scaled to [0, 1], C values.
        std: per-channel standard deviation, C values > 0.
        resize: the filter of `RESIZE`.
        antialias: whether a shrunk image is low-pass filtered first (Pillow's `resize`, whose
            filter widens with the scale); without it each output pixel interpolates its nearest
            inputs (Pillow's `transform`), as `keras.layers.Resizing` and `tf.image.resize` do by
            default. Enlarging is the same either way.
        crop: one of `CROPS`.
        channels: C; `prepare` makes 1 (grayscale) or 3 (RGB).
    """

    image_size: tuple
    mean: tuple
    std: tuple
    resize: str = "bilinear"
    antialias: bool = False
    crop: str = "center"
    channels: int = 3

    def __post_init__(self):
        if self.resize not in RESIZE:
            raise ValueError(f"resize={self.resize!r} is not allowed; use one of {tuple(RESIZE)}")
        if self.crop not in CROPS:
            raise ValueError(f"crop={self.crop!r} is not allowed; use one of {CROPS}")
        if len(self.mean) != self.channels or len(self.std) != self.channels or min(self.std) <= 0:
            raise ValueError(f"mean={self.mean} and std={self.std} need {self.channels} values each, std > 0")

    def get_config(self):
        """The record as JSON-able data; `Preprocessing.from_config` reads it back."""
        return {"image_size": list(self.image_size), "mean": list(self.mean), "std": list(self.std),
                "resize": self.resize, "antialias": self.antialias, "crop": self.crop, "channels": self.channels}

    @classmethod
    def from_config(cls, config):
        """The record of `get_config`'s dict."""
        return cls(**{**config, "image_size": tuple(config["image_size"]), "mean": tuple(config["mean"]),
                      "std": tuple(config["std"])})

    def prepare(self, image, size=None):
        """A Pillow image -> uint8 pixels (H, W, C) at `size` (H, W), by default `image_size`."""
        if self.channels not in (1, 3):
            raise ValueError(f"images are prepared as 1 (grayscale) or 3 (RGB) channels; this model takes "
                             f"channels={self.channels}: feed it its own arrays")
        image = image.convert("L" if self.channels == 1 else "RGB")
        height, width = self.image_size if size is None else size
        box = (0, 0, *image.size)
        if self.crop == "center":  # the centered box of the target's aspect ratio
            scale = min(image.size[0] / width, image.size[1] / height)
            w, h = width * scale, height * scale
            # Clamped to the image: width * (W / width) can round past W (29 x 29 to 28 x 28 gives
            # 29.000000000000004), and Pillow refuses a box that starts before the image.
            (W, H) = image.size
            box = (max(0.0, (W - w) / 2), max(0.0, (H - h) / 2), min(W, (W + w) / 2), min(H, (H + h) / 2))
        target = (width, height)
        if self.crop == "pad":  # the whole image, fitted inside the target
            scale = min(width / image.size[0], height / image.size[1])
            target = (max(1, round(image.size[0] * scale)), max(1, round(image.size[1] * scale)))
        out = self._resize(image, target, box)
        if out.size != (width, height):
            canvas = Image.new(out.mode, (width, height))
            canvas.paste(out, ((width - out.size[0]) // 2, (height - out.size[1]) // 2))
            out = canvas
        return np.asarray(out, "uint8").reshape(height, width, self.channels)  # (H, W) -> (H, W, 1) for "L"

    def prepare_array(self, pixels, size=None):
        """uint8 pixels (h, w, C') -> uint8 pixels (H, W, C), as `prepare` makes them; C' of 1, 3 or
        4 (RGBA, whose alpha is dropped as Pillow's conversion drops it)."""
        pixels = np.asarray(pixels, "uint8")
        return self.prepare(Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels), size)

    def _resize(self, image, target, box):
        if image.size == target and box == (0, 0, *image.size):
            return image
        if self.antialias:
            return image.resize(target, RESIZE[self.resize], box=box)
        # Point sampling of the box (no low-pass filter), as tf.image.resize(antialias=False).
        return image.transform(target, Image.Transform.EXTENT, box, RESIZE[self.resize])

    def normalize(self, pixels, xp=None, channels_first=False):
        """Pixels in [0, 255] (any real dtype) -> the model's input, float32: (pixels / 255 - mean) / std.

        Computed as (pixels - 255 mean) * (1 / (255 std)), constants rounded once to float32: a
        subtraction and a product, which every library rounds alike. A division by a constant is
        not: XLA turns it into a product by the reciprocal, which differs in the last bit.

        Args:
            pixels: (..., C), or (B, C, H, W) with `channels_first`; an array or tensor of `xp`.
            xp: `keras.ops` (the default) or `tensorflow`: the library whose `cast` and
                `convert_to_tensor` build the result.
            channels_first: whether the channels are axis 1 of a (B, C, H, W) batch.
        """
        if xp is None:
            from keras import ops as xp
        shape = (-1, 1, 1) if channels_first else (-1,)  # (C,) -> (C, 1, 1) against (B, C, H, W)
        offset, scale = (xp.convert_to_tensor(np.reshape(v, shape).astype("float32")) for v in self._affine())
        return (xp.cast(pixels, "float32") - offset) * scale

    def _affine(self):
        """(255 mean, 1 / (255 std)) in float64, (C,) each."""
        return 255.0 * np.asarray(self.mean, "float64"), 1.0 / (255.0 * np.asarray(self.std, "float64"))
