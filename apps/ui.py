"""The Gradio page: `build_demo(model, labels, examples) -> gr.Blocks`. Launching is `apps.demo`'s job;
the events are bound in `apps.events`.

Layout (CSS in `apps/static/page.css`): the input (image and preprocessing), the result (top classes, the
overlay and its controls, the per-head maps, the model facts), and the examples with the notes on
preprocessing. Wider than 700 px the result is a column of its own beside the input, with the
examples under the input; narrower, the three follow each other in that order, so the result comes
right under the image. A second tab, "What the model learned", draws the paper's Figure 7 (center,
right) for the served model (`learned_tab`).
"""

import dataclasses

import gradio as gr
import numpy as np

import keras_vit
from keras_vit.io.images import MAX_PIXELS, open_image
from apps import events
from apps.page import GALLERY_COLUMNS, ClampedSlider, IntegerInput, TextInput, UploadedImage, model_facts
from apps.images import FASHION_EXPLANATION, attention_distance_figure, model_pixels, position_similarity_figure
from apps.inference import RELEVANCE, TOP_K, VIEWS, Predictor

TITLE = "keras_vit: Vision Transformer demo"
NO_EXAMPLES = ("No example images for this model: pass `--examples DIR` (a folder of images, or of class "
               "sub-folders) to offer some. Training writes them beside the checkpoint, in `examples/`.")


@dataclasses.dataclass
class Page:
    """The components that the events read and write (see `apps.events`)."""

    image: gr.Image
    fashion: gr.Checkbox
    examples: gr.Examples
    unlike: gr.HTML
    top: gr.Label
    overlay: gr.Image
    caption: gr.HTML
    view: gr.Radio
    class_name: gr.Dropdown
    layer: gr.Slider
    head: gr.Dropdown
    opacity: gr.Slider
    controls_note: gr.Markdown
    per_head: gr.Gallery
    facts: gr.HTML
    patch: gr.State
    api: dict  # the hidden inputs of the /predict API


def build_demo(model, labels, examples=None, ood=None, title=TITLE):
    """The app for `model` with class names `labels`; `examples` is an `apps.sources.Examples`
    (images to click on) or None; `ood` the model's `keras_vit.ood.Stats` (the page then says when
    an image is unlike the training data) or None."""
    predictor = Predictor(model, labels, ood)
    # The first calls on a backend trace their kernels; make them here, not in the first user's latency.
    predictor.warm_up()
    with gr.Blocks(title=title, delete_cache=(1800, 3600), fill_width=True) as demo:
        gr.Markdown(f"# {title}\nDrop or paste an image: the model's {top_label(model.num_classes).lower()}, why "
                    "it chose each one, and where each patch looks.")
        with gr.Tab("Classify"):
            page = _classify_tab(predictor, examples)
        with gr.Tab("What the model learned"):
            learned_tab(predictor, examples)
        events.bind(predictor, page, title)
    return demo


def _classify_tab(predictor, examples):
    model = predictor.model
    with gr.Row(equal_height=False, elem_id="main"):
        with gr.Column(elem_id="input-column"):
            image = UploadedImage(label="Image", type="filepath", sources=["upload", "clipboard"], height=320,
                                  elem_id="input-image", elem_classes=["pixel-image"])
            fashion = gr.Checkbox(value=model.num_channels == 1, visible=model.num_channels == 1,
                                  label="Fashion-MNIST-style preprocessing")
        with gr.Column(elem_id="classes-column"):  # under the input, so that the overlay has the other column
            classes = _classes(predictor)
        with gr.Column(elem_id="result-column"):
            result = _result(predictor)
        with gr.Column(elem_id="more-column"):  # under the input when wide, under the result when narrow
            example_set = _examples(image, examples)
            if model.num_channels == 1:
                gr.Markdown(FASHION_EXPLANATION, elem_classes=["explain"])
            gr.Markdown(f"Any image Pillow reads, up to {MAX_PIXELS / 1e6:.0f} MP.", elem_classes=["explain"])
    api = _api_inputs(predictor)
    return Page(image=image, fashion=fashion, examples=example_set, api=api, **classes, **result)


def top_label(num_classes):
    """The result's label: "Top 5 classes", or as many as a model with fewer classes has."""
    shown = min(TOP_K, num_classes)
    return "Top class" if shown == 1 else f"Top {shown} classes"


def _classes(predictor):
    """The out-of-domain warning and the top classes."""
    unlike = gr.HTML("", label="Out-of-domain warning", elem_id="unlike")
    top = gr.Label(num_top_classes=TOP_K, label=top_label(predictor.model.num_classes), elem_id="top")
    if predictor.ood_off:
        gr.Markdown(predictor.ood_off, elem_classes=["explain"], elem_id="ood-off")
    return dict(unlike=unlike, top=top)


def _result(predictor):
    """The overlay, its caption and legend, and the controls of the map."""
    model = predictor.model
    # No fixed height: the block grows with the image (at most 320 px, apps.page), so its label
    # never pushes the image's foot out of the block.
    overlay = gr.Image(label="Overlay (the image as the model saw it)", interactive=False, elem_id="overlay",
                       elem_classes=["pixel-image"])
    caption = gr.HTML("", label="Caption", elem_id="caption")
    gr.Markdown("Click a class to see why the model chose it; click the overlay to see where a patch looks.",
                elem_classes=["explain"])
    view = gr.Radio(list(predictor.views), value=RELEVANCE, label="Map", elem_id="view")
    class_name = gr.Dropdown(predictor.labels, value=None, label="Class (of the class relevance map)",
                             elem_id="class-name")
    with gr.Row(elem_id="controls"):
        layer = ClampedSlider(1, model.num_layers, value=model.num_layers, step=1, label="Layer", min_width=150,
                              interactive=False, elem_classes=["clamped"], elem_id="layer")
        head = gr.Dropdown(["mean"] + [str(k + 1) for k in range(model.num_heads)], value="mean", label="Head",
                           min_width=110, interactive=False, elem_id="head")
        opacity = ClampedSlider(0.0, 1.0, value=0.5, step=0.05, label="Opacity", min_width=150,
                                elem_classes=["clamped"], elem_id="opacity")
    controls_note = gr.Markdown(VIEWS[RELEVANCE].controls_note(), elem_classes=["explain"], elem_id="controls-note")
    per_head = gr.Gallery(label="Per-head maps of the chosen layer", columns=GALLERY_COLUMNS, height="auto",
                          object_fit="contain", elem_id="heads", allow_preview=False, visible=False)
    facts = gr.HTML(model_facts(model), label="Model facts", elem_id="facts")
    return dict(overlay=overlay, caption=caption, view=view, class_name=class_name,
                layer=layer, head=head, opacity=opacity, controls_note=controls_note, per_head=per_head, facts=facts,
                patch=gr.State(None))


def _examples(image, examples):
    if not examples:
        gr.Markdown(NO_EXAMPLES, elem_classes=["explain"], elem_id="no-examples")
        return None
    return gr.Examples(examples=[str(p) for p in examples.paths], inputs=image, examples_per_page=24,
                       label=f"Examples from {examples.source} (click one)")


def _api_inputs(predictor):
    """Hidden inputs of the /predict API, typed for clients: the page's own controls clamp what a
    user types, where an API call with a bad value gets an error naming it."""
    model = predictor.model
    return dict(
        view=TextInput(RELEVANCE, label="View", visible=False),
        class_name=TextInput("", label="Class", visible=False),
        patch_row=IntegerInput(0, label="Patch row", visible=False),  # 0: the center patch
        patch_column=IntegerInput(0, label="Patch column", visible=False),
        layer=IntegerInput(model.num_layers, label="Layer", visible=False),
        head=TextInput("mean", label="Head", visible=False),
        opacity=gr.Number(0.5, label="Opacity", visible=False),
    )


ANALYSIS_IMAGES = 8
PLOT_MIN_WIDTH = 420  # px: narrower than two of these, the plots stack


def learned_tab(predictor, examples):
    """Position-embedding similarity, and the mean attention distance over the first example images
    (`examples`, an `apps.sources.Examples` or None; without examples that plot is left out and the
    tab says why). Layers and heads are numbered from 1."""
    model = predictor.model
    text = ("**Position embeddings**: cosine similarity between the learned position embeddings; tile (i, j) "
            "compares patch (i, j) with every patch.")
    distance = None
    if examples:
        paths = examples.paths[:ANALYSIS_IMAGES]
        pixels = np.stack([model_pixels(open_image(p), model.preprocessing, True) for p in paths])
        distance = predictor.attention_distance(pixels)
        text += ("\n\n**Attention distance**: for each head, the average image distance between a query patch and "
                 f"the patches it attends to, weighted by attention, over {len(paths)} example images from "
                 f"{examples.source} (the paper's Figure 7).")
    else:
        text += ("\n\n**Attention distance** needs images, and this model has no examples: pass `--examples DIR` "
                 "to draw it.")
    gr.Markdown(text, elem_classes=["explain"])
    with gr.Row():
        gr.Plot(position_similarity_figure(keras_vit.position_embedding_similarity(model)),
                label="Position embeddings", show_label=False, min_width=PLOT_MIN_WIDTH, elem_id="position-plot")
        if distance is not None:
            gr.Plot(attention_distance_figure(distance, model.image_size), label="Attention distance",
                    show_label=False, min_width=PLOT_MIN_WIDTH, elem_id="distance-plot")
