"""The demo's pure prediction functions: an image in, the top classes and one explanation map out.
Nothing here knows about Gradio, so it is tested directly.

Shapes: L layers, K heads, T tokens (prefix + h * w patches), (h, w) token grid, (H, W) image size.

The views (what the overlay shows):
- "class relevance": `keras_vit.class_relevance` of one class (default the top one): why this class;
- "patch attention": where one patch looks, its attention row in a layer and head;
- "rollout": attention rollout over all layers, the same for every class;
- "class-token attention" (models with pooling "token") or "mean patch attention" (models that pool
  their patches, such as the shipped GAP model): one layer's attention of the row that the head
  reads (`keras_vit.ViT.summary_row`) to each patch; the same for every class.

What is computed once per image and kept (`Analysis`): a new image runs one block-by-block pass
(`keras_vit.explain.attention_summary`: the logits, every layer's and head's summary row and the
rollout) and, when the model has out-of-domain statistics, its `keras_vit.ood` verdict. The
relevance view computes the class asked about on first use, with the other top classes in the
same call for small models (`SMALL_MODEL_MACS`); a patch view needs one layer's full (K, T, T)
maps, computed on first use by a pass up to that layer. All of it is kept, so every later setting
of the same image redraws from what is kept.

The views are records, one `View` each: how its map is computed, the line that says what it
shows, how its colours scale, and which controls apply. A new view is one entry of `VIEWS`.
Settings count layers, heads and patches from 1, as the page does; the maps index them from 0.

Each upload has its own token grid for a model with `dynamic_image_size` (the image resized to
about the model's area at its aspect ratio) and for a model with `max_seq_len` (patch sequences,
`keras_vit.naflex`): the image is scaled to the largest grid within the token budget at its
aspect ratio and run as one sequence padded to the budget, so every upload runs the same compiled
shape. The maps come back on that grid, and the overlay shows the image as the model saw it. The
out-of-domain score of such a model takes the image at its square `image_size`, as the training
run fitted its statistics (`training.ood_stats`).
"""

import collections
import dataclasses
import hashlib
import os
import threading
from typing import Callable

import keras
import numpy as np
from keras import ops
from PIL import Image

import keras_vit
import keras_vit.explain
import keras_vit.ood
from keras_vit import naflex
from keras_vit.io.images import open_image
from apps.images import blend, model_pixels, outline, overlay_shape, own_size_pixels

RELEVANCE, PATCH, ROLLOUT = "class relevance", "patch attention", "rollout"
CLASS_TOKEN, MEAN_PATCH = "class-token attention", "mean patch attention"
# The legend's two ends for each kind of view.
RELEVANCE_LEGEND = ("no relevance", "the top class's strongest patch")
ATTENTION_LEGEND = ("least in this map", "most in this map")
ATTENTION_METHOD = ("The attention probabilities of the chosen layer and head (softmax of queries times keys), "
                    "as the model computed them for this image. The colours run from this map's least to its "
                    "most.")


@dataclasses.dataclass(frozen=True)
class View:
    """One view of the overlay.

    name: the page's and the API's name for it; compute: (predictor, analysis, settings) ->
    ((h, w) map, the (K, T) attention rows that the per-head maps show or None, whether the model
    ran); caption: (settings, labels, probs) -> one line saying what the overlay shows; method:
    the text under "How is this computed?"; legend: (what the darkest colour means, what the
    brightest means); fixed_scale: the map is already in [0, 1] on a scale shared across the
    classes of an image (otherwise each map runs from its own least to its most); layered: layer
    and head choose the map, and the per-head maps are shown; outlined: the chosen patch is
    outlined.
    """

    name: str
    compute: Callable
    caption: Callable
    method: str
    legend: tuple = ATTENTION_LEGEND
    fixed_scale: bool = False
    layered: bool = False
    outlined: bool = False

    def controls_note(self, maps=True):
        """One line under the controls: what layer and head do in this view, or why they are off;
        `maps`: whether per-head maps are shown below (none before an image, or after a refused one)."""
        if self.layered:
            return "Layer and head choose the attention shown" + ("; the per-head maps are below." if maps else ".")
        return f"Layer and head are off: the {self.name} map combines all layers and heads."


def shared_scale(relevance, probs, class_index):
    """An (h, w) relevance map of class `class_index` in [0, 1] on one scale for every class of the
    image: relative to its own strongest patch, times the class's probability relative to the top
    class's (`probs`), so that a map's brightness says how likely its class is as well as where.
    The relevance of each class has its own range (the gradient of an unlikely class's
    log-probability is larger, not smaller), so the maps' raw values do not share a scale."""
    relevance = np.clip(np.asarray(relevance, "float32"), 0, None)
    peak = float(relevance.max())
    weight = float(probs[class_index] / max(float(np.max(probs)), 1e-12))
    return relevance / peak * weight if peak > 0 else relevance


def _relevance(predictor, analysis, s):
    heat, ran = predictor.relevance(analysis, s.class_index)
    return shared_scale(heat, analysis.probs, s.class_index), None, ran


def _patch(predictor, analysis, s):
    maps, ran = predictor.layer_maps(analysis, s.layer - 1)  # (K, T, T)
    (row, column), (_, w) = s.patch, analysis.grid(predictor.model)
    rows = maps[:, predictor.model.num_prefix_tokens + (row - 1) * w + column - 1]  # (K, T, T) -> (K, T)
    return predictor.grid(rows, _head_index(s), analysis.grid(predictor.model)), rows, ran


def _summary(predictor, analysis, s):
    rows = analysis.rows[s.layer - 1]  # (L, K, T) -> (K, T): the class token's, or the mean patch row
    return predictor.grid(rows, _head_index(s), analysis.grid(predictor.model)), rows, False


def _head_index(s):
    return s.head if s.head == "mean" else s.head - 1


def _head(s):
    return "mean of the heads" if s.head == "mean" else f"head {s.head}"


VIEWS = {v.name: v for v in (
    View(RELEVANCE, _relevance,
         lambda s, labels, probs: (f"Why {labels[s.class_index]} ({probs[s.class_index]:.0%}): the brighter a patch, "
                                   f"the more it raised the model's belief in {labels[s.class_index]}."),
         "Class relevance (Chefer, Gur and Wolf, ICCV 2021): each layer's attention, weighted by its gradient for "
         "this class's log-probability (positive part, mean of the heads), accumulated through the layers. The "
         "colours share one scale across the classes of an image: a map's relevance relative to its own strongest "
         "patch, times the class's probability relative to the top class's, so the top class's strongest patch is "
         "the brightest colour and a class the model finds unlikely stays dark. The darkest colour means no "
         "relevance, whatever the image shows there.",
         RELEVANCE_LEGEND, fixed_scale=True),
    View(PATCH, _patch,
         lambda s, labels, probs: (f"Where the outlined patch (row {s.patch[0]}, column {s.patch[1]}) looks: its "
                                   f"attention in layer {s.layer}, {_head(s)}. Click the overlay to choose another "
                                   "patch."),
         ATTENTION_METHOD, layered=True, outlined=True),
    View(ROLLOUT, lambda predictor, analysis, s: (analysis.rollout, None, False),
         lambda s, labels, probs: ("Attention rollout: where what the model classifies from comes from, through "
                                   "all layers; the same map for every class."),
         "Attention rollout (Abnar and Zuidema, 2020): each layer's attention, averaged over the heads and with the "
         "residual connection added, multiplied through the layers. The colours run from this map's least to its "
         "most."),
    View(CLASS_TOKEN, _summary,
         lambda s, labels, probs: (f"The class token's attention to each patch in layer {s.layer}, {_head(s)}; the "
                                   "same map for every class."),
         ATTENTION_METHOD, layered=True),
    View(MEAN_PATCH, _summary,
         lambda s, labels, probs: (f"The attention to each patch in layer {s.layer}, {_head(s)}, averaged over all "
                                   "patches as queries (this model classifies from all patches, not a class "
                                   "token); the same map for every class."),
         ATTENTION_METHOD, layered=True),
)}


def views(model):
    """The names of the views the page offers for `model`, in order; the last one shows the row that
    its head reads (`ViT.summary_row`): the class token's for pooling="token", else the mean patch row."""
    return RELEVANCE, PATCH, ROLLOUT, (CLASS_TOKEN if model.pooling == "token" else MEAN_PATCH)


OVERLAY_SIZE = 384
HEAD_SIZE = 160
TOP_K = 5
# The relevance view computes five classes of an image in one call (the class asked for and the
# most probable others: at first the top five) when the model is small: a pass on a CPU then costs
# mostly per-operation overhead, so five classes cost about what one does. Larger models compute
# each class on its first click. The threshold comes from `python -m benchmarks.studies.app_clicks`; its
# figures are in docs/app.md ("Cost of a click").
SMALL_MODEL_MACS = 1e9
MACS_KEYS = ("image_size", "patch_size", "num_channels", "hidden_dim", "num_layers", "mlp_dim", "num_classes",
             "pooling", "class_token", "representation_size", "num_register_tokens")
# What is kept per image: at most this many images, and this many bytes of maps in all.
CACHE_SIZE = 32
CACHE_BYTES = 256 * 2**20


def own_grid(model):
    """Whether each upload gets its own token grid: a model with `dynamic_image_size`, or one served
    with patch sequences (`max_seq_len`)."""
    return model.dynamic_image_size or model.max_seq_len is not None


def relevance_batch(model):
    """How many classes the relevance view computes in one call (see `SMALL_MODEL_MACS`)."""
    if model.stem is not None:  # a hybrid: its ResNet stem is not counted, and it is not small
        return 1
    # From the model's attributes: model.get_config() would import TensorFlow where it is installed
    # (Keras' serializer checks for its TensorShape), seconds and log lines in a JAX demo.
    macs = keras_vit.model_macs({key: getattr(model, key) for key in MACS_KEYS})["total"]
    return min(TOP_K, model.num_classes) if macs < SMALL_MODEL_MACS else 1


@dataclasses.dataclass(frozen=True)
class Settings:
    """What to show. Layers, heads and patches count from 1, as on the page and in the API (and
    in the paper); a class is its index in the labels.

    view: one of `views(model)`; class_index: the class of the relevance view (None: the top
    class); patch: (row, column) of the patch view (None: the center patch); layer: the layer of
    the layer views (None: the last); head: "mean" or a head from 1; opacity: the map's weight in
    the overlay, 0..1; fashion_style: the Fashion-MNIST preprocessing of one-channel models.
    `Predictor.check` is the one check of these values.
    """

    view: str = RELEVANCE
    class_index: int = None
    patch: tuple = None
    layer: int = None
    head: object = "mean"
    opacity: float = 0.5
    fashion_style: bool = True


@dataclasses.dataclass
class Analysis:
    """What is kept of one image: (H, W, C) pixels as the model saw them, (classes,) probabilities,
    (L, K, T) summary rows, (h, w) rollout, the out-of-domain line (`keras_vit.ood.Verdict.message`:
    "" for a usual image or without statistics), the maps computed so far: class index -> (h, w)
    relevance, layer -> (K, T, T); and, for a model with `max_seq_len`, `inputs`, the image's
    patch sequence padded to the budget (`keras_vit.naflex.patch_sequences`), which the model
    runs. T counts the image's own tokens: the padding's rows and columns are dropped."""

    pixels: np.ndarray
    probs: np.ndarray
    rows: np.ndarray
    rollout: np.ndarray
    unlike: str = ""
    relevance: dict = dataclasses.field(default_factory=dict)
    maps: dict = dataclasses.field(default_factory=dict)
    inputs: dict = None

    def grid(self, model):
        """(h, w), the token grid of these pixels for `model` (its own with `own_grid`)."""
        return tuple(n // model.token_pixels for n in self.pixels.shape[:2])

    @property
    def nbytes(self):
        arrays = [self.pixels, self.probs, self.rows, self.rollout, *self.relevance.values(), *self.maps.values(),
                  *(self.inputs or {}).values()]
        return sum(a.nbytes for a in arrays)


@dataclasses.dataclass(frozen=True)
class Result:
    """top: {class name: probability} of the top classes; overlay: (S, S', 3) uint8; per_head: a
    list of ((s, s', 3) uint8, caption) for the layer views, else empty; caption: one line saying
    what the overlay shows; settings: those used, with the class and patch filled in; ran_model:
    whether the model ran for this result (False when all of it was kept from an earlier one);
    unlike: a plain-words line saying that the image is unlike the training data, with its
    percentile among held-out in-domain images (`keras_vit.ood.describe`), or "" (usual, or no
    statistics)."""

    top: dict
    overlay: np.ndarray
    per_head: list
    caption: str
    settings: Settings
    ran_model: bool
    unlike: str = ""


class Predictor:
    """Serves one `keras_vit.ViT`.

    Args:
        model: a built `keras_vit.ViT` with a classifier head.
        labels: one name per output class.
        ood: the model's `keras_vit.ood.Stats` with a threshold, or None: each image then gets an
            out-of-domain score, computed with its first pass. Statistics without a threshold whose
            `off` says why the check is off are taken too: `ood_off` then holds that line.
    """

    def __init__(self, model, labels, ood=None):
        if model.num_classes is None or model.num_classes < 1:
            raise ValueError(f"the demo needs a classifier head; got num_classes={model.num_classes}")
        if len(labels) != model.num_classes:
            raise ValueError(f"got {len(labels)} labels for a model with num_classes={model.num_classes}")
        if ood is not None and ood.threshold is None and ood.off is None:
            raise ValueError("the out-of-domain statistics have no threshold; "
                             "set one with keras_vit.ood.with_threshold")
        self.model = model
        self.labels = list(labels)
        # Statistics whose check is off (`Stats.off`: too few training images) flag nothing; the page says why.
        self.ood = ood if ood is None or ood.off is None else None
        self.ood_off = None if ood is None else ood.off
        self.views = views(model)
        self.relevance_batch = relevance_batch(model)
        # Keras layers are not documented as thread-safe; the model calls are short, the image
        # work around them runs in parallel.
        self._lock = threading.Lock()
        self._cache = collections.OrderedDict()  # (SHA-256 of the file, fashion) -> Analysis
        self._cache_lock = threading.Lock()

    def warm_up(self):
        """Runs each model call once on a blank image, so that a backend traces its kernels before
        the first user waits for them."""
        mode = "L" if self.model.num_channels == 1 else "RGB"
        analysis, _ = self.analyze(Image.new(mode, self.model.image_size[::-1]))  # the out-of-domain score too
        self.relevance(analysis, 0)
        self.layer_maps(analysis, self.model.num_layers - 1)

    def forward(self, pixels):
        """(B, H, W, C) uint8 pixels -> NumPy float32 logits (B, classes), summary rows (B, L, K, T)
        (each layer's and head's class-token row, or mean patch row) and rollout (B, h, w)."""
        return self._summary(self._normalize(pixels))

    def _summary(self, inputs):
        """`forward` of the model's input: normalized images, or patch sequences, whose rollout is
        a list of B maps, each on its image's grid."""
        with self._lock:
            logits, rows, rollout = keras_vit.explain.attention_summary(self.model, inputs)
            return _numpy(logits), _numpy(rows), rollout if isinstance(rollout, list) else _numpy(rollout)

    def attention_distance(self, pixels):
        """(B, H, W, C) uint8 pixels -> the (L, K) mean attention distance in pixels (Figure 7)."""
        with self._lock:
            return keras_vit.explain.mean_attention_distance(self.model, self._normalize(pixels))

    def predict(self, image, settings=Settings()):
        """Classifies one image (a path, file object or PIL image, any mode; see
        `keras_vit.io.images.open_image`) and draws the map of `settings`, checked here (`check`);
        returns a `Result`."""
        return self.predict_checked(image, self.check(settings))

    def predict_checked(self, image, settings):
        """`predict` with `settings` that `check` returned already (the page checks them where they
        come in)."""
        analysis, ran = self.analyze(image, settings.fashion_style)
        grid = analysis.grid(self.model)
        if own_grid(self.model):  # its grid is the image's own, known now
            _check_patch(settings.patch, grid, "this image's patch grid")
        order = np.argsort(-analysis.probs)[:TOP_K]
        settings = dataclasses.replace(
            settings,
            class_index=int(order[0]) if settings.class_index is None else settings.class_index,
            patch=settings.patch or tuple(n // 2 + 1 for n in grid),
        )
        view = VIEWS[settings.view]
        heat, rows, ran_map = view.compute(self, analysis, settings)
        overlay = self._draw(analysis, heat, settings, OVERLAY_SIZE, view)
        per_head = [] if rows is None or not view.layered else [
            (self._draw(analysis, self.grid(rows, k, grid), settings, HEAD_SIZE, view), f"head {k + 1}")
            for k in range(self.model.num_heads)]
        top = {self.labels[i]: float(analysis.probs[i]) for i in order}
        return Result(top, overlay, per_head, view.caption(settings, self.labels, analysis.probs), settings,
                      ran or ran_map, analysis.unlike)

    def _draw(self, analysis, heat, s, size, view):
        """The image with the (h, w) map `heat` over it, `size` pixels on its longer side."""
        image = blend(analysis.pixels, heat, s.opacity, size, scaled=view.fixed_scale)
        if view.outlined:
            row, column = s.patch
            image = outline(image, (row - 1, column - 1), analysis.grid(self.model))
        return image

    def grid(self, rows, head, grid=None):
        """(K, T) attention rows of one layer -> the (h, w) attention to the patches, of `head` or the
        mean of the heads; (h, w) is `grid`, by default the model's `grid_size`."""
        row = rows.mean(axis=0) if head == "mean" else rows[head]  # (K, T) -> (T,)
        return keras.ops.convert_to_numpy(self.model.patch_grid(row[None], grid))[0]  # (1, T) -> (h, w)

    def overlay_grid(self, image, fashion_style=True):
        """((rows, columns) of the overlay, (h, w) patch grid) of `image` as `predict` draws it: the
        model's own for a fixed size, the image's for a model with `own_grid` (analysed, or kept)."""
        if own_grid(self.model):
            analysis, _ = self.analyze(image, fashion_style)
            return overlay_shape(analysis.pixels.shape, OVERLAY_SIZE), analysis.grid(self.model)
        return overlay_shape(self.model.image_size, OVERLAY_SIZE), self.model.grid_size

    def analyze(self, image, fashion_style=True):
        """The `Analysis` of `image` and whether the model ran: kept per file content (its SHA-256)
        and preprocessing, so later settings of the same image reuse it, also when an API client
        uploads it again with each call."""
        key = None
        if isinstance(image, (str, os.PathLike)):
            with open(image, "rb") as f:
                key = (hashlib.file_digest(f, "sha256").hexdigest(), bool(fashion_style))
            with self._cache_lock:
                if key in self._cache:
                    self._cache.move_to_end(key)
                    return self._cache[key], False
        im, m = open_image(image), self.model
        if m.max_seq_len is None:
            pixels = model_pixels(im, m.preprocessing, fashion_style, m.token_pixels if m.dynamic_image_size else None)
            logits, rows, rollout = self.forward(pixels[None])
            unlike, inputs = self._unlike(pixels), None
        else:
            # The image at its grid within the budget, as patch_sequences makes it: the overlay shows
            # these pixels, and the model runs them packed into one sequence.
            resized = naflex.resize_to_budget(own_size_pixels(im, m.preprocessing, fashion_style), m.patch_size,
                                              m.max_seq_len)
            pixels = np.rint(resized).astype("uint8")
            inputs = naflex.pack([resized], m.patch_size, m.max_seq_len, m.image_mean, m.image_std)
            logits, rows, rollout = self._summary(inputs)
            rows = rows[..., : self._tokens(pixels)]  # (1, L, K, R + max_seq_len) -> (1, L, K, T)
            unlike = "" if self.ood is None else self._unlike(model_pixels(im, m.preprocessing, fashion_style))
        probs = _numpy(ops.softmax(logits[0]))
        analysis = Analysis(pixels, probs, rows[0], np.asarray(rollout[0], "float32"), unlike, inputs=inputs)
        if key is not None:
            with self._cache_lock:
                self._cache[key] = analysis
                self._trim()
        return analysis, True

    def _unlike(self, pixels):
        if self.ood is None:
            return ""
        with self._lock:
            return keras_vit.ood.check(self.model, pixels[None], self.ood).message(0)

    def relevance(self, analysis, class_index):
        """The (h, w) relevance of `class_index` for the analysed image, and whether the model ran.

        A class not yet kept is computed in one call with the most probable classes not yet kept,
        `relevance_batch` classes in all: the top five of a small model come with its first map.
        The count never changes, so JAX compiles the computation once (a new count of classes is
        a new shape, which costs it about as long as ten calls)."""
        if class_index in analysis.relevance:
            return analysis.relevance[class_index], False
        others = [int(c) for c in np.argsort(-analysis.probs) if c != class_index and int(c) not in analysis.relevance]
        todo = [class_index, *others][: self.relevance_batch]
        # One image with several classes: one forward pass, then one backward sweep per class.
        with self._lock:
            maps = keras_vit.class_relevance(self.model, self._inputs(analysis), todo)
        maps = np.stack(maps) if isinstance(maps, list) else _numpy(maps)  # a patch sequence's: C maps (h, w)
        self._keep(analysis.relevance, dict(zip(todo, maps.astype("float32"))))  # (C, h, w)
        return analysis.relevance[class_index], True

    def layer_maps(self, analysis, layer):
        """The (K, T, T) attention maps of `layer` for the analysed image, and whether the model ran."""
        if layer in analysis.maps:
            return analysis.maps[layer], False
        with self._lock:
            maps = keras_vit.attention_maps(self.model, self._inputs(analysis), layers=(layer,))
        t = self._tokens(analysis.pixels)  # a patch sequence's padding dropped
        self._keep(analysis.maps, {layer: _numpy(maps)[0, 0, :, :t, :t]})  # (1, 1, K, T', T') -> (K, T, T)
        return analysis.maps[layer], True

    def _keep(self, store, new):
        with self._cache_lock:
            store.update(new)
            self._trim()

    def _trim(self):
        """Forgets the least recently used images beyond `CACHE_SIZE` images or `CACHE_BYTES`."""
        while len(self._cache) > 1 and (
            len(self._cache) > CACHE_SIZE or sum(a.nbytes for a in self._cache.values()) > CACHE_BYTES
        ):
            self._cache.popitem(last=False)

    def _normalize(self, pixels):
        return self.model.normalize(ops.convert_to_tensor(pixels))

    def _inputs(self, analysis):
        """The model's input for the analysed image: its patch sequence, or its normalized pixels."""
        return analysis.inputs if analysis.inputs is not None else self._normalize(analysis.pixels[None])

    def _tokens(self, pixels):
        """T, the prefix and patch tokens of (H, W, C) pixels as the model saw them."""
        h, w = (n // self.model.token_pixels for n in pixels.shape[:2])
        return self.model.num_prefix_tokens + h * w

    def check(self, s):
        """The one check of the page's and the API's settings (`Settings`, counted from 1): `s` with
        the layer filled in; a ValueError names any value out of range and what is allowed."""
        m = self.model
        if s.view not in self.views:
            raise ValueError(f"view={s.view!r}; choose one of {self.views}")
        if s.class_index is not None and not 0 <= s.class_index < m.num_classes:
            raise ValueError(f"class_index={s.class_index} is out of range for a model with {m.num_classes} classes")
        if not own_grid(m):  # otherwise the grid is the image's own: `predict` checks it
            _check_patch(s.patch, m.grid_size)
        if s.layer is not None and not 1 <= s.layer <= m.num_layers:
            raise ValueError(f"layer={s.layer} is out of range; this model has layers 1 to {m.num_layers}")
        if s.head != "mean" and not 1 <= s.head <= m.num_heads:
            raise ValueError(f"head={str(s.head)!r}; use 'mean' or '1' to '{m.num_heads}'")
        if not 0.0 <= s.opacity <= 1.0:
            raise ValueError(f"opacity={s.opacity:g} is out of range; use a value from 0 to 1")
        return dataclasses.replace(s, layer=m.num_layers if s.layer is None else s.layer)


def _check_patch(patch, grid, what="the patch grid"):
    """A ValueError unless `patch` (row, column, from 1) is None or inside the (h, w) `grid`."""
    if patch is not None and not all(1 <= i <= n for i, n in zip(patch, grid)):
        raise ValueError(f"patch (row {patch[0]}, column {patch[1]}) is outside {what}: rows 1 to {grid[0]}, "
                         f"columns 1 to {grid[1]} (0, 0 in the API: the center patch)")


def _numpy(a):
    return np.asarray(keras.ops.convert_to_numpy(ops.cast(a, "float32")))
