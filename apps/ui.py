"""The Gradio page: `build_demo(model, labels) -> gr.Blocks`. Launching is `apps.demo`'s job.

Output images are written by `publish`, each to a fresh directory inside Gradio's cache, and
returned as paths. Returning NumPy arrays instead would go through Gradio 6.31's
`processing_utils.save_pil_to_cache`, which names the file by the hash of its bytes and writes it in
place: when two requests produce the same image, one truncates and rewrites the file while the other
is being served, and the client gets a short read ("Too little data for declared Content-Length")
or a broken image, about 10-35% of the time at 8 parallel clients. A unique file per response has
a single writer, so nothing is rewritten while it is read; `tests/test_app_race.py` reproduces
the upstream race and checks this path.

Events: an upload (or paste, or clear) fires the image's `input` event once, and an example click
fires the examples' own load event once; each runs `classify` once. The image's `change` event is
not used: it also fires while an upload replaces the shown image, which sent two requests per
upload. Layers and heads are numbered from 1 on the page, as in the paper.
"""

import html
import sys
import time
import uuid
from pathlib import Path

import gradio as gr
import numpy as np
from PIL import Image

from apps import layout
from keras_vit.io.images import MAX_PIXELS, ImageRejected
from apps.inference import VIEWS, Predictor
from apps.preprocess import FASHION_EXPLANATION
from apps.learned import learned_tab

TITLE = "keras_vit: Vision Transformer demo"


class UploadedImage(gr.Image):
    """`gr.Image` that hands the function the path of the uploaded file, unopened.

    Stock `gr.Image(type="filepath")` still opens the file with Pillow in `preprocess`, so a hostile
    upload would fail inside Gradio with a generic error; here all decoding happens in
    `keras_vit.io.images.open_image`, which refuses it with a clear message. `is_template` makes the
    browser use the ordinary Image widget.
    """

    is_template = True

    def preprocess(self, payload):
        if payload is None:
            return None
        if payload.path is None or (payload.url or "").startswith("data:"):
            raise gr.Error("Send the image as a file upload.", title="Image refused")
        path = Path(payload.path).resolve()
        # Gradio already refuses input paths outside its upload folder; check again, cheaply.
        if not path.is_relative_to(Path(self.GRADIO_CACHE).resolve()):
            raise gr.Error("Only uploaded files are accepted.", title="Image refused")
        return str(path)


def publish(array, cache_dir, name="image.png"):
    """Writes a (H, W, 3) uint8 array to a PNG in its own new directory under `cache_dir` and
    returns the path (see the module docstring for why not return the array)."""
    directory = Path(cache_dir) / "keras_vit" / uuid.uuid4().hex
    directory.mkdir(parents=True)
    path = directory / name
    Image.fromarray(np.asarray(array, "uint8")).save(path, format="PNG")
    return str(path)


def model_facts(model, latency_ms=None, ran_model=True):
    """An HTML table (no header row) of what is being served, and how long the last result took."""
    h, w = model.image_size
    if latency_ms is None:
        latency = "-"
    else:
        latency = f"{latency_ms:.0f} ms" + ("" if ran_model else " (maps redrawn, model not rerun)")
    rows = [
        ("preset", model.preset or "custom"),
        ("resolution", f"{h} x {w} px, {model.num_channels} channel(s), patch {model.patch_size}"),
        ("tokens", f"{model.grid_size[0]} x {model.grid_size[1]} patches" + (" + class token" if model.class_token else ", GAP")),
        ("layers x heads", f"{model.num_layers} x {model.num_heads}"),
        ("parameters", f"{model.count_params():,}"),
        ("classes", str(model.num_classes)),
        ("latency of this result", latency),
    ]
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f'<table class="facts"><caption>Model facts</caption>{body}</table>'


def build_demo(model, labels, examples=(), title=TITLE):
    """The app for `model` with class names `labels`; `examples` are image paths to click on."""
    predictor = Predictor(model, labels)
    # The first call on a backend traces its kernels; do it here, not in the first user's latency.
    predictor.forward(np.zeros((1, *model.image_size, model.num_channels), "uint8"))
    examples = [str(p) for p in examples]
    with gr.Blocks(title=title, delete_cache=(1800, 3600), fill_width=True) as demo:
        gr.Markdown(f"# {title}\nDrop or paste an image: the model's top five classes, and where it looked.")
        with gr.Tab("Classify"):
            controls, outputs, example_set = _classify_tab(model, examples)
        with gr.Tab("What the model learned"):
            learned_tab(predictor, examples)
        _wire(predictor, controls, outputs, example_set, title)
    return demo


def _wire(predictor, controls, outputs, example_set, title):
    """Binds `classify` to the events that should run it, each of them once."""
    model = predictor.model
    cache_dir = outputs[1].GRADIO_CACHE
    cleared = (None, None, [], model_facts(model))

    def classify(image, view, layer, head, opacity, fashion):
        if image is None:
            return cleared
        start = time.perf_counter()
        head = head if head == "mean" else int(head) - 1  # the page counts heads from 1
        try:
            top, overlay, per_head, ran = predictor.explain(image, view, int(layer) - 1, head, opacity, fashion)
        except ImageRejected as e:
            # A warning toast, not gr.Error: an error would also put an "Error" badge on every
            # output pane and log a traceback, for an input refused on purpose.
            print(f"{title}: refused an upload: {e}", file=sys.stderr, flush=True)
            # Gradio 6.31 heads a toast with its kind ("Warning") whatever the title, so the
            # message names the app as well.
            gr.Warning(f"{title}: image refused. {e}", title=f"{title}: image refused")
            return cleared
        latency_ms = (time.perf_counter() - start) * 1000
        gallery = [(publish(a, cache_dir, f"head{k + 1}.png"), c) for k, (a, c) in enumerate(per_head)]
        return top, publish(overlay, cache_dir, "overlay.png"), gallery, model_facts(model, latency_ms, ran)

    image, view, layer, head, opacity, fashion = controls
    gr.on(
        triggers=[image.input, view.change, layer.release, head.change, opacity.release, fashion.change],
        fn=classify,
        inputs=list(controls),
        outputs=list(outputs),
        api_name="predict",
        api_description=(
            "Classifies an image. Layers and heads count from 1. Returns the top-5 classes with "
            "probabilities, the attention overlay, the per-head maps of the chosen layer, and the "
            "model facts with the latency. A refused image gives empty outputs and a warning."
        ),
        trigger_mode="always_last",
        show_progress_on=[outputs[1]],
    )
    if example_set is not None:  # the click loads the example without a queued request; then classify once
        example_set.load_input_event.success(classify, list(controls), list(outputs), api_visibility="undocumented",
                                             show_progress_on=[outputs[1]])


def _classify_tab(model, examples):
    """The Classify tab's components: (controls, outputs, the examples or None)."""
    example_set = None
    with gr.Row(equal_height=False):
        with gr.Column(min_width=300):
            image = UploadedImage(
                label="Image", type="filepath", sources=["upload", "clipboard"], height=320,
                elem_id="input-image", elem_classes=["pixel-image"],
            )
            fashion = gr.Checkbox(
                value=model.num_channels == 1,
                visible=model.num_channels == 1,
                label="Fashion-MNIST-style preprocessing",
            )
            if model.num_channels == 1:
                gr.Markdown(FASHION_EXPLANATION)
            gr.Markdown(f"Any image Pillow reads, up to {MAX_PIXELS / 1e6:.0f} MP.")
            if examples:
                example_set = gr.Examples(examples=examples, inputs=image, label="Examples (click one)",
                                          examples_per_page=24)
        with gr.Column(min_width=300):
            top = gr.Label(num_top_classes=5, label="Top 5 classes")
            overlay = gr.Image(label="Attention overlay (the image as the model saw it)", interactive=False,
                               height=320, elem_id="overlay", elem_classes=["pixel-image"])
            view = gr.Radio(
                list(VIEWS),
                value=VIEWS[0],
                label="Map",
                info="Rollout: attention multiplied through all layers. Class-token attention: the chosen "
                "layer's attention from the class token (for GAP models, the mean over patch queries).",
            )
            with gr.Row():
                layer = gr.Slider(1, model.num_layers, value=model.num_layers, step=1, label="Layer", min_width=120)
                head = gr.Dropdown(["mean"] + [str(k + 1) for k in range(model.num_heads)], value="mean",
                                   label="Head", min_width=100)
                opacity = gr.Slider(0.0, 1.0, value=0.5, step=0.05, label="Opacity", min_width=120)
            facts = gr.HTML(model_facts(model), elem_id="facts")
    gallery = gr.Gallery(label="Per-head class-token attention of the chosen layer", columns=layout.GALLERY_COLUMNS,
                         height="auto", object_fit="contain", elem_id="heads", allow_preview=False)
    return (image, view, layer, head, opacity, fashion), (top, overlay, gallery, facts), example_set
