"""Images in the demo: from an upright "RGB"/"L" image (see `keras_vit.io.images.open_image`) to
the pixels a model takes (`model_pixels`), and drawing a map over the image as the model saw it
(`blend`, `outline`).

Fashion-MNIST-style models (one channel) were trained on garments that are light on a black
background, cropped to the garment and scaled so that its long side fills the 28-pixel frame. A
photo of a shirt on a white table is the opposite, so `fashion_style` inverts light backgrounds,
stretches the contrast so that the background is 0, crops to the garment and pads it to a square.

The "What the model learned" tab's figures (`position_similarity_figure`, `attention_distance_figure`:
the paper's Figure 7, center and right) are built with `matplotlib.figure.Figure`, not pyplot, so no
global state is shared between requests. They are drawn small (about 4.5 inches) with large text, so
that they stay readable when the page shows them 330 px wide on a phone.
"""

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from PIL import Image, ImageDraw

FASHION_EXPLANATION = (
    "This model was trained on Fashion-MNIST: light garments on a black background, cropped to the "
    "garment and padded to a square. With *Fashion-MNIST-style preprocessing* on, an image with a light "
    "background is inverted, its contrast stretched so the background is black, cropped to the object "
    "and padded to a square before it is resized. The overlay shows the image exactly as the model saw it."
)
# A pixel belongs to the object when it is this much brighter than the (inverted) background.
OBJECT_THRESHOLD = 40


def model_pixels(im, preprocessing, fashion_style=False, patch=None):
    """The (H, W, C) uint8 pixels for a model whose input is described by `preprocessing` (its
    `ViT.preprocessing`): `Preprocessing.prepare`, the one step from an image to a model's pixels,
    which the training pipeline takes too. With `fashion_style`, a one-channel model's image is
    first prepared as described in the module docstring. With `patch` (the pixels of one token of a
    model with `dynamic_image_size`), the image keeps its shape instead: it is resized to about the
    area of the model's size, each side a multiple of `patch` (`dynamic_size`).
    """
    im = _styled(im, preprocessing, fashion_style)
    height, width = preprocessing.image_size
    size = None if patch is None else dynamic_size(im.size[::-1], height * width, patch)
    return preprocessing.prepare(im, size)


def own_size_pixels(im, preprocessing, fashion_style=False):
    """The (h, w, C) uint8 pixels of `im` at its own size, in the model's channels (Pillow's "L" or
    "RGB" conversion), after the `fashion_style` step of `model_pixels`: what a patch-sequence
    model's `keras_vit.naflex.patch_sequences` takes, as the training pipeline feeds it decoded
    images at their own size."""
    im = _styled(im, preprocessing, fashion_style).convert("L" if preprocessing.channels == 1 else "RGB")
    return np.asarray(im, "uint8").reshape(im.size[1], im.size[0], preprocessing.channels)


def _styled(im, preprocessing, fashion_style):
    if preprocessing.channels not in (1, 3):
        raise ValueError(f"the demo serves models with num_channels 1 or 3; got num_channels={preprocessing.channels}")
    if preprocessing.channels == 1 and fashion_style:
        return fashion_mnist_style(im.convert("L"))
    return im


def dynamic_size(shape, budget, patch):
    """(H, W) for an image of `shape` (rows, columns) shown to a dynamic model: the same aspect
    ratio within one patch per side, an area of at most about `budget` pixels, and each side a
    multiple of `patch` (at least one patch)."""
    rows, cols = shape
    scale = (budget / (rows * cols)) ** 0.5
    return tuple(max(1, round(n * scale / patch)) * patch for n in (rows, cols))


def fashion_mnist_style(im):
    """An "L" image -> a square "L" image with a black background and the object filling it.

    Hand-written because Pillow's `autocontrast`/`pad` know nothing of which side is background: the
    background level is the median of the border pixels.
    """
    a = np.asarray(im, "float32")
    border = np.concatenate([a[0], a[-1], a[:, 0], a[:, -1]])
    if np.median(border) > 127:
        a = 255 - a
    background = float(np.median(np.concatenate([a[0], a[-1], a[:, 0], a[:, -1]])))
    peak = float(a.max())
    if peak - background > 1:
        a = np.clip((a - background) / (peak - background), 0, 1) * 255
    rows, cols = np.nonzero(a > OBJECT_THRESHOLD)
    if rows.size:
        a = a[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1]
    side = max(a.shape)
    square = np.zeros((side, side), "float32")
    top, left = (side - a.shape[0]) // 2, (side - a.shape[1]) // 2
    square[top : top + a.shape[0], left : left + a.shape[1]] = a
    return Image.fromarray(np.rint(square).astype("uint8"), "L")


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


def position_similarity_figure(similarity):
    """(h, w, h, w) cosine similarities -> a figure with one (h, w) tile per patch, laid out as the
    patches are, so tile (i, j) shows how similar patch (i, j)'s embedding is to every other's."""
    h, w = similarity.shape[:2]
    pad = np.full((h, w, h + 1, w + 1), np.nan)
    pad[:, :, :h, :w] = similarity
    mosaic = pad.transpose(0, 2, 1, 3).reshape(h * (h + 1), w * (w + 1))  # (h, h+1, w, w+1) -> tiles
    fig = Figure(figsize=(4.6, 4.2))
    ax = fig.add_subplot()
    im = ax.imshow(mosaic, cmap="viridis", vmin=-1, vmax=1, interpolation="nearest")
    ax.set_title("Position embedding similarity")
    ax.set_xlabel("input patch column")
    ax.set_ylabel("input patch row")
    ax.set_xticks([(j + 0.5) * (w + 1) - 1 for j in range(w)], [str(j + 1) for j in range(w)])
    ax.set_yticks([(i + 0.5) * (h + 1) - 1 for i in range(h)], [str(i + 1) for i in range(h)])
    ax.tick_params(labelsize=9)
    fig.colorbar(im, ax=ax, label="cosine similarity")
    fig.tight_layout()
    return fig


def attention_distance_figure(distance, image_size):
    """(L, K) mean attention distances in pixels -> a scatter plot of each head against depth."""
    num_layers, num_heads = distance.shape
    fig = Figure(figsize=(4.6, 3.6))
    ax = fig.add_subplot()
    for k in range(num_heads):
        ax.scatter(np.arange(1, num_layers + 1), distance[:, k], s=14, label=f"head {k + 1}")
    ax.set_xlabel("network depth (layer)")
    ax.set_ylabel("mean attention distance (pixels)")
    ax.set_title("Mean attention distance")
    ax.set_ylim(0, max(image_size))
    ax.set_xticks(np.arange(1, num_layers + 1))
    if num_heads <= 16:
        ax.legend(fontsize=8, ncol=2, loc="lower right")
    fig.tight_layout()
    return fig
