"""Drawing a map over the image as the model saw it."""

import matplotlib
import numpy as np
from PIL import Image, ImageDraw

OUTLINE_COLOR = (0, 255, 255)  # cyan: apart from every colour of "inferno"


COLORMAP = "inferno"


def blend(pixels, heat, opacity, size, scaled=False):
    """(H, W, C) uint8 pixels and an (h, w) map -> (size, size', 3) uint8: the image upscaled, with
    the map colored by COLORMAP blended over it at `opacity`. The map is min-max scaled, or, when
    `scaled`, taken as already in [0, 1] (0 the darkest colour, 1 the brightest)."""
    out = overlay_shape(pixels.shape, size)
    base = Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels).convert("RGB")
    base = np.asarray(base.resize(out[::-1], Image.Resampling.NEAREST), "float32")
    heat = np.asarray(heat, "float32")
    if not scaled:
        heat = (heat - heat.min()) / max(float(heat.max() - heat.min()), 1e-12)
    heat = np.asarray(Image.fromarray(heat, "F").resize(out[::-1], Image.Resampling.BILINEAR))
    color = matplotlib.colormaps[COLORMAP](np.clip(heat, 0, 1))[..., :3] * 255  # (S, S') -> (S, S', 3)
    return np.rint((1 - opacity) * base + opacity * color).astype("uint8")


def gradient_css(stops=9):
    """A CSS linear-gradient of COLORMAP from its darkest to its brightest colour, for the legend."""
    colors = matplotlib.colormaps[COLORMAP](np.linspace(0, 1, stops))[:, :3] * 255
    return "linear-gradient(to right, " + ", ".join(f"rgb({r:.0f} {g:.0f} {b:.0f})" for r, g, b in colors) + ")"


def overlay_shape(shape, size):
    """(rows, columns) of the overlay of an image of `shape` (H, W, ...): `size` rows, its aspect ratio."""
    height, width = shape[:2]
    return size, max(1, round(size * width / height))


def outline(image, patch, grid_size):
    """(S, S', 3) uint8 -> a copy with patch (row, column) of an (h, w) grid outlined."""
    rows, cols = image.shape[:2]
    (r, c), (h, w) = patch, grid_size
    box = (c * cols / w, r * rows / h, (c + 1) * cols / w - 1, (r + 1) * rows / h - 1)  # (x0, y0, x1, y1)
    im = Image.fromarray(image)
    ImageDraw.Draw(im).rectangle([round(v) for v in box], outline=OUTLINE_COLOR, width=max(1, rows // 128))
    return np.asarray(im)


def patch_at(xy, image_shape, grid_size):
    """The (row, column) of the patch under pixel (x, y) of an image of `image_shape` (S, S', ...)
    that shows an (h, w) grid; points outside are moved to the nearest patch."""
    (x, y), (rows, cols), (h, w) = xy, image_shape[:2], grid_size
    return min(h - 1, max(0, int(y * h / rows))), min(w - 1, max(0, int(x * w / cols)))
