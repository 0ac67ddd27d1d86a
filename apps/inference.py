"""The demo's pure prediction function: an image in, the top classes, an attention overlay and the
per-head maps out. Nothing here knows about Gradio, so it is tested directly.

Shapes: L layers, K heads, T tokens (prefix + h * w patches), (h, w) token grid, (H, W) image size.

The overlays need, of each layer's (K, T, T) attention, only the class token's row (for models
without one, the mean patch row), and the rollout's (h, w) map: `keras_vit.explain.attention_summary`
reduces each block's maps to those as it runs, in the same pass that gives the logits, so neither
the forward pass nor the cache holds (L, K, T, T) maps.
"""

import collections
import os
import threading

import keras
import matplotlib
import numpy as np
from keras import ops
from PIL import Image

import keras_vit.explain
from keras_vit.io.images import open_image
from apps.preprocess import model_pixels

OVERLAY_SIZE = 384
HEAD_SIZE = 160
VIEWS = ("rollout", "class-token attention")
# Forward passes kept per Predictor, so that changing the view, layer, head or opacity of a recent
# image redraws the maps without running the model again.
CACHE_SIZE = 32


class Predictor:
    """Serves one `keras_vit.ViT`.

    Args:
        model: a built `keras_vit.ViT` with a classifier head.
        labels: one name per output class.
    """

    def __init__(self, model, labels):
        if model.num_classes is None or model.num_classes < 1:
            raise ValueError(f"the demo needs a classifier head; got num_classes={model.num_classes}")
        if len(labels) != model.num_classes:
            raise ValueError(f"got {len(labels)} labels for a model with num_classes={model.num_classes}")
        self.model = model
        self.labels = list(labels)
        # Keras layers are not documented as thread-safe; the forward pass is short, the image
        # work around it runs in parallel.
        self._lock = threading.Lock()
        self._cache = collections.OrderedDict()  # (path, mtime, size, fashion) -> (pixels, logits, rows, rollout)
        self._cache_lock = threading.Lock()

    def forward(self, pixels):
        """(B, H, W, C) uint8 pixels -> NumPy float32 logits (B, classes), summary rows (B, L, K, T)
        (each layer's and head's class-token row, or mean patch row) and rollout (B, h, w)."""
        with self._lock:
            x = self.model.normalize(ops.convert_to_tensor(pixels))
            outputs = keras_vit.explain.attention_summary(self.model, x)  # logits, rows, rollout
            return tuple(np.asarray(ops.convert_to_numpy(ops.cast(a, "float32"))) for a in outputs)

    def attention_distance(self, pixels):
        """(B, H, W, C) uint8 pixels -> the (L, K) mean attention distance in pixels (Figure 7)."""
        with self._lock:
            x = self.model.normalize(ops.convert_to_tensor(pixels))
            return keras_vit.explain.mean_attention_distance(self.model, x)

    def predict(self, image, view="rollout", layer=-1, head="mean", opacity=0.5, fashion_style=True, top_k=5):
        """Classifies one image and explains it.

        Args:
            image: a path, file object or PIL image (any mode; see `keras_vit.io.images.open_image`).
            view: "rollout" (attention rollout over all layers) or "class-token attention" of `layer`.
            layer: the layer (0-based, negative counts from the end) for the class-token view and
                the per-head maps. Captions count layers and heads from 1, as the paper does.
            head: "mean" or a head index (0-based), for the class-token view.
            opacity: heatmap weight in the overlay, 0..1.
            fashion_style: for one-channel models, the Fashion-MNIST preprocessing.
            top_k: how many classes to return.

        Returns:
            (labels, overlay, per_head): a {name: probability} dict of the top `top_k` classes, the
            overlay as (S, S, 3) uint8, and a list of ((s, s, 3) uint8, caption) per head.
        """
        return self.explain(image, view, layer, head, opacity, fashion_style, top_k)[:3]

    def explain(self, image, view="rollout", layer=-1, head="mean", opacity=0.5, fashion_style=True, top_k=5):
        """`predict`'s results plus `ran_model`: False when the forward pass of a recent call on the
        same file was reused (only paths are cached, keyed by path, mtime and size)."""
        view, layer, head, opacity = self._check(view, layer, head, opacity)
        (pixels, logits, rows, rollout), ran_model = self._forward_cached(image, fashion_style)
        probs = keras.ops.convert_to_numpy(keras.ops.softmax(logits[0]))
        order = np.argsort(-probs)[:top_k]
        labels = {self.labels[i]: float(probs[i]) for i in order}
        heat = rollout[0] if view == "rollout" else self.class_token_map(rows[0, layer], head)
        overlay = blend(pixels, heat, opacity, OVERLAY_SIZE)
        per_head = [
            (blend(pixels, self.class_token_map(rows[0, layer], k), opacity, HEAD_SIZE), f"layer {layer + 1} head {k + 1}")
            for k in range(rows.shape[2])
        ]
        return labels, overlay, per_head, ran_model

    def _forward_cached(self, image, fashion_style):
        """((H, W, C) pixels, (1, classes) logits, (1, L, K, T) rows, (1, h, w) rollout) and whether
        the model ran."""
        key = None
        if isinstance(image, (str, os.PathLike)):
            stat = os.stat(image)
            key = (os.fspath(image), stat.st_mtime_ns, stat.st_size, bool(fashion_style))
            with self._cache_lock:
                if key in self._cache:
                    self._cache.move_to_end(key)
                    return self._cache[key], False
        im = open_image(image)
        pixels = model_pixels(im, self.model.image_size, self.model.num_channels, fashion_style)
        result = (pixels, *self.forward(pixels[None]))
        if key is not None:
            with self._cache_lock:
                self._cache[key] = result
                while len(self._cache) > CACHE_SIZE:
                    self._cache.popitem(last=False)
        return result, True

    def class_token_map(self, layer_rows, head):
        """(K, T) summary rows of one layer -> the (h, w) attention of the class token (or, without
        one, the mean patch query) to the patches, for `head` or the mean of the heads."""
        row = layer_rows.mean(axis=0) if head == "mean" else layer_rows[head]  # (K, T) -> (T,)
        return row[self.model.num_prefix_tokens :].reshape(self.model.grid_size)  # (N,) -> (h, w)

    def _check(self, view, layer, head, opacity):
        if view not in VIEWS:
            raise ValueError(f"view={view!r}; choose one of {VIEWS}")
        n = self.model.num_layers
        if not -n <= int(layer) < n:
            raise ValueError(f"layer={layer} is out of range for a model with {n} layers")
        if head != "mean":
            head = int(head)
            if not 0 <= head < self.model.num_heads:
                raise ValueError(f"head={head}; use 'mean' or 0..{self.model.num_heads - 1} (0-based)")
        if not 0.0 <= float(opacity) <= 1.0:
            raise ValueError(f"opacity={opacity}; use a value in [0, 1]")
        return view, int(layer) % n, head, float(opacity)


def blend(pixels, heat, opacity, size):
    """(H, W, C) uint8 pixels and an (h, w) map -> (size, size', 3) uint8: the image upscaled, with
    the min-max scaled map colored by "inferno" blended over it at `opacity`."""
    height, width = pixels.shape[:2]
    out = (size, max(1, round(size * width / height)))  # (rows, cols)
    base = Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels).convert("RGB")
    base = np.asarray(base.resize(out[::-1], Image.Resampling.NEAREST), "float32")
    heat = np.asarray(heat, "float32")
    heat = (heat - heat.min()) / max(float(heat.max() - heat.min()), 1e-12)
    heat = np.asarray(Image.fromarray(heat, "F").resize(out[::-1], Image.Resampling.BILINEAR))
    color = matplotlib.colormaps["inferno"](np.clip(heat, 0, 1))[..., :3] * 255  # (S, S') -> (S, S', 3)
    return np.rint((1 - opacity) * base + opacity * color).astype("uint8")
