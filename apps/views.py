"""The overlay's views and the lines of text that say what each shows (see `apps.inference`)."""

RELEVANCE, PATCH, ROLLOUT = "class relevance", "patch attention", "rollout"
CLASS_TOKEN, MEAN_PATCH = "class-token attention", "mean patch attention"
LAYER_VIEWS = (PATCH, CLASS_TOKEN, MEAN_PATCH)  # the views that show one layer and head
# The page names the method of the relevance view in this one line.
RELEVANCE_METHOD = ("each layer's attention weighted by its gradient for this class's log-probability (positive "
                    "part, mean of the heads), accumulated through the layers (Chefer, Gur and Wolf, ICCV 2021); "
                    "black patches get 0.")


def views(model):
    """The views the page offers for `model`, in order; the last one depends on its class token."""
    return RELEVANCE, PATCH, ROLLOUT, (CLASS_TOKEN if model.class_token else MEAN_PATCH)


def caption(s, labels, probs):
    """One line saying what the overlay of `apps.inference.Settings` `s` shows (layers, heads and
    patches counted from 1), for class names `labels` and probabilities `probs`."""
    head = "mean of the heads" if s.head == "mean" else f"head {s.head + 1}"
    if s.view == RELEVANCE:
        return f"Why {labels[s.class_index]} ({probs[s.class_index]:.0%}): {RELEVANCE_METHOD}"
    if s.view == PATCH:
        return (f"Where the outlined patch (row {s.patch[0] + 1}, column {s.patch[1] + 1}) looks: its attention "
                f"in layer {s.layer + 1}, {head}. Click the overlay to choose another patch.")
    if s.view == ROLLOUT:
        return ("Attention rollout: the head-mean attention of all layers multiplied together (Abnar and "
                "Zuidema, 2020); the same map for every class.")
    if s.view == CLASS_TOKEN:
        return (f"The class token's attention to each patch in layer {s.layer + 1}, {head}; "
                "the same map for every class.")
    return (f"The attention to each patch in layer {s.layer + 1}, {head}, averaged over all patches as queries "
            "(this model has no class token); the same map for every class.")


def controls_note(view):
    """One line under the controls: what layer and head do in `view`, or why they are off."""
    if view in LAYER_VIEWS:
        return "Layer and head choose the attention shown; the per-head maps are below."
    return f"Layer and head are off: the {view} map combines all layers and heads."
