"""Gradio components with the input handling the page needs, and `publish`, which writes output
images so that parallel responses never share a file."""

import math
import uuid
from pathlib import Path

import gradio as gr
import numpy as np
from PIL import Image


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
            raise gr.Error("Send the image as a file upload.", title="Image refused", print_exception=False)
        path = Path(payload.path).resolve()
        # Gradio already refuses input paths outside its upload folder; check again, cheaply.
        if not path.is_relative_to(Path(self.GRADIO_CACHE).resolve()):
            raise gr.Error("Only uploaded files are accepted.", title="Image refused", print_exception=False)
        return str(path)


class ClampedSlider(gr.Slider):
    """`gr.Slider` whose typed value is clamped into [minimum, maximum] and rounded to the step
    (an integer when the step is), instead of stock Gradio's error toast, error badge and server
    traceback; a value that is not a number reaches the function as None.

    The page's head script makes Enter apply a typed value as Tab does, and sends nothing for an
    empty or unchanged box (`apps.layout.HEAD`).
    """

    is_template = True

    def preprocess(self, payload):
        return clamp(payload, self.minimum, self.maximum, self.step)


class IntegerInput(gr.Number):
    """A `gr.Number` that the API types as an integer, whose value reaches the function as sent:
    the function refuses a fraction or an out-of-range value with a message naming it, where stock
    `gr.Number(precision=0)` would round silently or answer with Gradio's own error and a traceback."""

    is_template = True

    def api_info(self):
        return {"type": "integer"}


def clamp(value, low, high, step):
    """`value` clamped into [low, high] and rounded to a multiple of `step` from `low` (ties up); an
    int when `low` and `step` are; None for anything that is not a finite number."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(value):
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
    `tests/test_app_race.py` reproduces the upstream race and checks this path.
    """
    directory = Path(cache_dir) / "keras_vit" / uuid.uuid4().hex
    directory.mkdir(parents=True)
    path = directory / name
    Image.fromarray(np.asarray(array, "uint8")).save(path, format="PNG")
    return str(path)
