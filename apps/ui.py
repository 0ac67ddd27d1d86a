"""The Gradio page: `build_demo(model, labels) -> gr.Blocks`. Launching is `apps.demo`'s job.

Output images are written by `publish`, each to a fresh directory inside Gradio's cache, and
returned as paths. Returning NumPy arrays instead would go through Gradio 6.31's
`processing_utils.save_pil_to_cache`, which names the file by the hash of its bytes and writes it in
place: when two requests produce the same image, one truncates and rewrites the file while the other
is being served, and the client gets a short read ("Too little data for declared Content-Length")
or a broken image, about 10-35% of the time at 8 parallel clients. A unique file per response has
a single writer, so nothing is rewritten while it is read; `tests/test_app_race.py` reproduces
the upstream race and checks this path.
"""

import time
import uuid
from pathlib import Path

import gradio as gr
import numpy as np
from PIL import Image

import keras_vit
from apps import plots
from apps.images import MAX_PIXELS, ImageRejected
from apps.inference import VIEWS, Predictor
from apps.preprocess import FASHION_EXPLANATION, model_pixels

ANALYSIS_IMAGES = 8


class UploadedImage(gr.Image):
    """`gr.Image` that hands the function the path of the uploaded file, unopened.

    Stock `gr.Image(type="filepath")` still opens the file with Pillow in `preprocess`, so a hostile
    upload would fail inside Gradio with a generic error; here all decoding happens in
    `apps.images.open_image`, which refuses it with a clear message. `is_template` makes the
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


def model_facts(model, latency_ms=None):
    """A Markdown table of what is being served, and how long the last prediction took."""
    h, w = model.image_size
    rows = [
        ("preset", model.preset or "custom"),
        ("resolution", f"{h} x {w} px, {model.num_channels} channel(s), patch {model.patch_size}"),
        ("tokens", f"{model.grid_size[0]} x {model.grid_size[1]} patches" + (" + class token" if model.class_token else ", GAP")),
        ("parameters", f"{model.count_params():,}"),
        ("classes", str(model.num_classes)),
        ("latency of this prediction", "-" if latency_ms is None else f"{latency_ms:.0f} ms"),
    ]
    return "| | |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)


def build_demo(model, labels, examples=(), title="keras_vit: Vision Transformer demo"):
    """The app for `model` with class names `labels`; `examples` are image paths to click on."""
    predictor = Predictor(model, labels)
    # The first call on a backend traces its kernels; do it here, not in the first user's latency.
    predictor.forward(np.zeros((1, *model.image_size, model.num_channels), "uint8"))
    examples = [str(p) for p in examples]
    with gr.Blocks(title=title, delete_cache=(1800, 3600)) as demo:
        gr.Markdown(f"# {title}\nDrop, paste or capture an image: the model's top five classes, and where it looked.")
        with gr.Tab("Classify"):
            controls, outputs = _classify_tab(model, examples)
        with gr.Tab("What the model learned"):
            _learned_tab(predictor, examples)
        image, view, layer, head, opacity, fashion = controls
        overlay_cache = outputs[1].GRADIO_CACHE

        def classify(image, view, layer, head, opacity, fashion):
            if image is None:
                return None, None, [], model_facts(model)
            start = time.perf_counter()
            try:
                top, overlay, per_head = predictor.predict(image, view, layer, head, opacity, fashion)
            except ImageRejected as e:
                raise gr.Error(str(e), title="Image refused") from e
            latency_ms = (time.perf_counter() - start) * 1000
            gallery = [(publish(a, overlay_cache, f"head{k}.png"), c) for k, (a, c) in enumerate(per_head)]
            return top, publish(overlay, overlay_cache, "overlay.png"), gallery, model_facts(model, latency_ms)

        gr.on(
            triggers=[image.change, view.change, layer.release, head.change, opacity.release, fashion.change],
            fn=classify,
            inputs=list(controls),
            outputs=list(outputs),
            api_name="predict",
            api_description=(
                "Classifies an image. Returns the top-5 classes with probabilities, the attention "
                "overlay, the per-head maps of the chosen layer, and the model facts with the latency."
            ),
            trigger_mode="always_last",
        )
    return demo


def _classify_tab(model, examples):
    with gr.Row():
        with gr.Column():
            image = UploadedImage(
                label="Image", type="filepath", sources=["upload", "clipboard", "webcam"], height=320
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
                gr.Examples(examples=examples, inputs=image, label="Examples (click one)", examples_per_page=24)
        with gr.Column():
            top = gr.Label(num_top_classes=5, label="Top 5 classes")
            overlay = gr.Image(label="Attention overlay (the image as the model saw it)", interactive=False, height=320)
            view = gr.Radio(
                list(VIEWS),
                value=VIEWS[0],
                label="Map",
                info="Rollout: attention multiplied through all layers. Class-token attention: the chosen "
                "layer's attention from the class token (for GAP models, the mean over patch queries).",
            )
            with gr.Row():
                layer = gr.Slider(0, model.num_layers - 1, value=model.num_layers - 1, step=1, label="Layer")
                head = gr.Dropdown(["mean"] + [str(k) for k in range(model.num_heads)], value="mean", label="Head")
                opacity = gr.Slider(0.0, 1.0, value=0.5, step=0.05, label="Opacity")
            gr.Markdown("### Model facts")
            facts = gr.Markdown(model_facts(model), label="Model facts")
    gallery = gr.Gallery(label="Per-head class-token attention of the chosen layer", columns=6, height="auto")
    return (image, view, layer, head, opacity, fashion), (top, overlay, gallery, facts)


def _learned_tab(predictor, examples):
    """The paper's Figure 7 (center, right) for this model, from `keras_vit`'s analysis functions."""
    model = predictor.model
    paths = examples[:ANALYSIS_IMAGES]
    if paths:
        from apps.images import open_image

        pixels = np.stack([model_pixels(open_image(p), model.image_size, model.num_channels, True) for p in paths])
        source = f"{len(paths)} example images"
    else:
        rng = np.random.default_rng(0)
        pixels = rng.integers(0, 256, (ANALYSIS_IMAGES, *model.image_size, model.num_channels), dtype="uint8")
        source = f"{ANALYSIS_IMAGES} random-noise images (no examples were given)"
    _, maps = predictor.forward(pixels)
    distance = keras_vit.mean_attention_distance(model, None, maps=maps)
    gr.Markdown(
        "Left: cosine similarity between the learned position embeddings; tile (i, j) compares patch "
        "(i, j) with every patch. Right: for each head, the average image distance between a query patch "
        f"and the patches it attends to, weighted by attention, over {source} (the paper's Figure 7)."
    )
    with gr.Row():
        gr.Plot(plots.position_similarity_figure(keras_vit.position_embedding_similarity(model)), label="Position embeddings")
        gr.Plot(plots.attention_distance_figure(distance, model.image_size), label="Attention distance")
