"""The page's parts: Gradio components with the input handling the page needs; `publish`, which
writes output images so that parallel responses never share a file; and the page's fixed texts
and its static files (`apps/static/`: page.css, toasts.css, page.js).

Widths from 360 px to 1920 px: the container uses the window (`fill_width`). Wider than 700 px the
main row is a grid of two columns, the input and the examples on the left and the result on the
right; narrower, one column: input, result, examples. The per-head gallery keeps its images at
every width. Explanatory text uses the body text colour (contrast above 4.5:1 on the theme's
background; `tests/app/test_app_browser.py` measures it).
"""

import html
import math
import uuid
from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np
from gradio.components.image import ImageData
from gradio.data_classes import GradioRootModel
from PIL import Image
from pydantic import ValidationError

from keras_vit.io.images import ImageRejected

GALLERY_COLUMNS = 6  # static/page.css fits as many 96-px tiles per row as the width allows
NARROW = 700  # px: below this the page is one column; the media queries of static/ use it
STATIC = Path(__file__).resolve().parent / "static"
CSS_PATHS = [STATIC / "page.css"]  # Gradio scopes it to the page's container
# The head: the toasts' CSS (they live outside the page's container) and the page's script.
HEAD = f"<style>{(STATIC / 'toasts.css').read_text()}</style><script>{(STATIC / 'page.js').read_text()}</script>"

# The image's `change` handler, run in the browser: when the image is emptied, so are the top classes,
# the overlay, its caption and the per-head maps; otherwise nothing changes (undefined: no update),
# and the toasts of an earlier upload (a refused file) are closed, so that none lies over the new
# result (`closeToasts`: apps/static/page.js). Gradio 6.31 drops a whole update when a Label is set
# to null, hence the empty confidences.
CLEAR_WITH_IMAGE = """(image, ...shown) => {
  if (image) { closeToasts(); return shown.map(() => undefined); }
  return [{label: null, confidences: []}, null, "", [], ""];
}"""

API_DESCRIPTION = (
    "Classifies an image and explains it. view: 'class relevance' (why class_name, default the top "
    "class), 'patch attention' (where the patch at patch_row, patch_column looks; 0, 0: the center "
    "patch), 'rollout', or the layer's class-token (or mean patch) attention. Layers, heads, rows and "
    "columns count from 1; head is 'mean' or a head number. Returns the top classes (up to 5), the "
    "overlay, its caption (HTML), the per-head maps of the chosen layer (layer views only), the model "
    "facts (HTML) and the out-of-domain warning (HTML; empty for an image like the training data, or "
    "when the model has no out-of-domain statistics). A refused image or a value out of range raises "
    "an error with the reason."
)


def caption_html(text, method="", legend=None, gradient=None):
    """The overlay's one-line caption as HTML; with `legend` ((darkest, brightest) meanings) and
    `gradient` (the colour map as a CSS gradient), a colour legend under it; with `method`, a
    closed "How is this computed?" that holds it."""
    out = f"<p>{html.escape(text)}</p>"
    if legend and gradient:
        low, high = (html.escape(t) for t in legend)
        out += (f'<div class="legend" aria-label="colour scale: from {low} to {high}"><span>{low}</span>'
                f'<span class="bar" style="background: {html.escape(gradient)}"></span><span>{high}</span></div>')
    if method:
        out += f"<details><summary>How is this computed?</summary><p>{html.escape(method)}</p></details>"
    return out


def warning_html(text):
    """The out-of-domain warning as HTML, or "" for no warning: its one sentence (`keras_vit.ood`)."""
    if not text:
        return ""
    return f'<p class="warning" role="alert">{html.escape(text)}</p>'


def model_facts(model, latency_ms=None, ran_model=True):
    """An HTML table (no header row) of what is being served, and how long the last result took."""
    h, w = model.image_size
    if latency_ms is None:
        latency = "-"
    else:
        latency = f"{latency_ms:.0f} ms" + ("" if ran_model else " (maps redrawn, model not rerun)")
    tokens = " + class token" if model.class_token else ", no class token"
    if model.max_seq_len is not None:  # patch sequences (keras_vit.naflex)
        resolution = f"at most {model.max_seq_len:,} patches, each upload at its own aspect ratio"
        patches = f"one per patch of the upload, at most {model.max_seq_len:,}"
    elif model.dynamic_image_size:
        resolution, patches = f"about {h * w:,} px, each upload at its own shape", "one per patch of the upload"
    else:
        resolution, patches = f"{h} x {w} px", f"{model.grid_size[0]} x {model.grid_size[1]} patches"
    rows = [
        ("preset", model.preset or "custom"),
        ("resolution", f"{resolution}, {model.num_channels} channel(s), patch {model.patch_size}"),
        ("tokens", patches + tokens),
        ("layers x heads", f"{model.num_layers} x {model.num_heads}"),
        ("parameters", f"{model.count_params():,}"),
        ("classes", str(model.num_classes)),
        ("latency of this result", latency),
    ]
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f'<table class="facts"><caption>Model facts</caption>{body}</table>'


class AnyPayload(GradioRootModel):
    """Whatever a client sent for the image, unvalidated: `UploadedImage.preprocess` checks it."""

    root: Any = None


class UploadedImage(gr.Image):
    """`gr.Image` that hands the function the path of the uploaded file, unopened, or an
    `ImageRejected` that says why what was sent is not one.

    Stock `gr.Image(type="filepath")` still opens the file with Pillow in `preprocess`, so a hostile
    upload would fail inside Gradio with a generic error; here all decoding happens in
    `keras_vit.io.images.open_image`, which refuses it with a clear message. Stock Gradio also
    validates the payload before `preprocess`, and an API call whose image is a number or a string
    ends there with a server traceback and a message that names nothing; here the payload reaches
    `preprocess` as sent (`data_model`, with the API's schema still ImageData's), and the event
    refuses it as it refuses a bad file. `is_template` makes the browser use the ordinary Image widget.
    """

    is_template = True
    data_model = AnyPayload

    def api_info(self):
        schema = ImageData.model_json_schema()
        schema["additional_description"] = schema.pop("description", None)
        return schema

    def preprocess(self, payload):
        sent = payload.root if isinstance(payload, AnyPayload) else payload
        if sent is None:
            return None
        try:
            image = ImageData.model_validate(sent, context={"validate_meta": True})
        except ValidationError:
            return ImageRejected(f"image={repr(sent)[:80]} is not an uploaded file; send one with "
                                 "gradio_client.handle_file(path)")
        if image.path is None or (image.url or "").startswith("data:"):
            return ImageRejected("Send the image as a file upload.")
        path = Path(image.path).resolve()
        # Gradio already refuses input paths outside its upload folder; check again, cheaply.
        if not path.is_relative_to(Path(self.GRADIO_CACHE).resolve()):
            return ImageRejected("Only uploaded files are accepted.")
        return str(path)


class ClampedSlider(gr.Slider):
    """`gr.Slider` whose typed value reaches the function as typed, or as None when it is not a
    finite number, and is clamped there (`clamp`: into [minimum, maximum], rounded to the step),
    instead of stock Gradio's error toast, error badge and server traceback. The function compares
    the value as typed with the one it shows, and sets the slider only when they differ.

    The page's head script makes Enter apply a typed value as Tab does, and sends nothing for an
    empty or unchanged box (`apps.page.HEAD`).
    """

    is_template = True

    def preprocess(self, payload):
        return number(payload)

    def clamp(self, value):
        """`value` (as `preprocess` gives it) clamped into this slider's range and step; None stays None."""
        return clamp(value, self.minimum, self.maximum, self.step)


class IntegerInput(gr.Number):
    """A `gr.Number` that the API types as an integer, whose value reaches the function as sent:
    the function refuses a fraction or an out-of-range value with a message naming it, where stock
    `gr.Number(precision=0)` would round silently or answer with Gradio's own error and a traceback."""

    is_template = True

    def api_info(self):
        return {"type": "integer"}


class TextInput(gr.Textbox):
    """A `gr.Textbox` whose value reaches the function as sent, so that the API refuses a number or a
    list where a string is expected, with a message naming it; stock `gr.Textbox` turns any value
    into its `str()` ("[1]") and the function could not tell."""

    is_template = True

    def preprocess(self, payload):
        return payload


def number(value):
    """`value` as a finite float, or None for anything that is not one."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def clamp(value, low, high, step):
    """`value` clamped into [low, high] and rounded to a multiple of `step` from `low` (ties up); an
    int when `low` and `step` are; None for anything that is not a finite number."""
    value = number(value)
    if value is None:
        return None
    steps = math.floor((min(max(value, low), high) - low) / step + 0.5)
    value = min(low + steps * step, high)
    return int(value) if float(low).is_integer() and float(step).is_integer() else round(value, 10)


def publish(array, cache_dir, name="image.png"):
    """Writes a (H, W, 3) uint8 array to a PNG in its own new directory under `cache_dir` and
    returns the path.

    Returning NumPy arrays instead would go through Gradio 6.31's
    `processing_utils.save_pil_to_cache`, which names the file by the hash of its bytes and writes
    it in place: when two requests produce the same image, one truncates and rewrites the file
    while the other is being served, and the client gets a short read ("Too little data for
    declared Content-Length") or a broken image, about 10-35% of the time at 8 parallel clients. A
    unique file per response has a single writer, so nothing is rewritten while it is read;
    `tests/app/test_app_race.py` reproduces the upstream race and checks this path.
    """
    directory = Path(cache_dir) / "keras_vit" / uuid.uuid4().hex
    directory.mkdir(parents=True)
    path = directory / name
    Image.fromarray(np.asarray(array, "uint8")).save(path, format="PNG")
    return str(path)
