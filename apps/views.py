"""The overlay's views and the lines of text that say what each shows (see `apps.inference`)."""

RELEVANCE, PATCH, ROLLOUT = "class relevance", "patch attention", "rollout"
CLASS_TOKEN, MEAN_PATCH = "class-token attention", "mean patch attention"
LAYER_VIEWS = (PATCH, CLASS_TOKEN, MEAN_PATCH)  # the views that show one layer and head
# How each view is computed, for the page's "How is this computed?" under the caption.
RELEVANCE_METHOD = ("Class relevance (Chefer, Gur and Wolf, ICCV 2021): each layer's attention, weighted by its "
                    "gradient for this class's log-probability (positive part, mean of the heads), accumulated "
                    "through the layers. The colours share one scale across the classes of an image: a map's "
                    "relevance relative to its own strongest patch, times the class's probability relative to "
                    "the top class's, so the top class's strongest patch is the brightest colour and a class "
                    "the model finds unlikely stays dark. The darkest colour means no relevance, whatever "
                    "the image shows there.")
ROLLOUT_METHOD = ("Attention rollout (Abnar and Zuidema, 2020): each layer's attention, averaged over the heads "
                  "and with the residual connection added, multiplied through the layers. The colours run from "
                  "this map's least to its most.")
ATTENTION_METHOD = ("The attention probabilities of the chosen layer and head (softmax of queries times keys), "
                    "as the model computed them for this image. The colours run from this map's least to its "
                    "most.")
# The legend's two ends for each kind of view.
RELEVANCE_LEGEND = ("no relevance", "the top class's strongest patch")
ATTENTION_LEGEND = ("least in this map", "most in this map")


def views(model):
    """The views the page offers for `model`, in order; the last one depends on its class token."""
    return RELEVANCE, PATCH, ROLLOUT, (CLASS_TOKEN if model.class_token else MEAN_PATCH)


def caption(s, labels, probs):
    """One line saying what the overlay of `apps.inference.Settings` `s` shows (layers, heads and
    patches counted from 1), for class names `labels` and probabilities `probs`."""
    head = "mean of the heads" if s.head == "mean" else f"head {s.head + 1}"
    if s.view == RELEVANCE:
        name = labels[s.class_index]
        return (f"Why {name} ({probs[s.class_index]:.0%}): the brighter a patch, the more it raised the model's "
                f"belief in {name}.")
    if s.view == PATCH:
        return (f"Where the outlined patch (row {s.patch[0] + 1}, column {s.patch[1] + 1}) looks: its attention "
                f"in layer {s.layer + 1}, {head}. Click the overlay to choose another patch.")
    if s.view == ROLLOUT:
        return ("Attention rollout: where the class token's information comes from, through all layers; "
                "the same map for every class.")
    if s.view == CLASS_TOKEN:
        return (f"The class token's attention to each patch in layer {s.layer + 1}, {head}; "
                "the same map for every class.")
    return (f"The attention to each patch in layer {s.layer + 1}, {head}, averaged over all patches as queries "
            "(this model has no class token); the same map for every class.")


def method(view):
    """What `view`'s map is and how its colours scale: the text under "How is this computed?"."""
    return {RELEVANCE: RELEVANCE_METHOD, ROLLOUT: ROLLOUT_METHOD}.get(view, ATTENTION_METHOD)


def legend(view):
    """(what the darkest colour means, what the brightest means) in `view`."""
    return RELEVANCE_LEGEND if view == RELEVANCE else ATTENTION_LEGEND


def controls_note(view):
    """One line under the controls: what layer and head do in `view`, or why they are off."""
    if view in LAYER_VIEWS:
        return "Layer and head choose the attention shown; the per-head maps are below."
    return f"Layer and head are off: the {view} map combines all layers and heads."
