"""The overlay's views, one `View` record each: how its map is computed, the line that says what
it shows, how its colours scale, and which controls apply (see `apps.inference`). A new view is
one entry of `VIEWS`.

Settings (`apps.inference.Settings`) count layers, heads and patches from 1, as the page does;
the maps index them from 0. Shapes: K heads, T tokens, (h, w) token grid.
"""

import dataclasses
from typing import Callable

import numpy as np

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

    def controls_note(self):
        """One line under the controls: what layer and head do in this view, or why they are off."""
        if self.layered:
            return "Layer and head choose the attention shown; the per-head maps are below."
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
         lambda s, labels, probs: ("Attention rollout: where the class token's information comes from, through all "
                                   "layers; the same map for every class."),
         "Attention rollout (Abnar and Zuidema, 2020): each layer's attention, averaged over the heads and with the "
         "residual connection added, multiplied through the layers. The colours run from this map's least to its "
         "most."),
    View(CLASS_TOKEN, _summary,
         lambda s, labels, probs: (f"The class token's attention to each patch in layer {s.layer}, {_head(s)}; the "
                                   "same map for every class."),
         ATTENTION_METHOD, layered=True),
    View(MEAN_PATCH, _summary,
         lambda s, labels, probs: (f"The attention to each patch in layer {s.layer}, {_head(s)}, averaged over all "
                                   "patches as queries (this model has no class token); the same map for every "
                                   "class."),
         ATTENTION_METHOD, layered=True),
)}


def views(model):
    """The names of the views the page offers for `model`, in order; the last one depends on its
    class token."""
    return RELEVANCE, PATCH, ROLLOUT, (CLASS_TOKEN if model.class_token else MEAN_PATCH)
