"""The page's CSS, head script and fixed texts, kept free of heavy imports so that `apps.demo` can
pass them to `launch` cheaply.

Widths from 360 px to 1920 px: the container uses the window (`fill_width`). Wider than 700 px the
main row is a grid of two columns, the input and the examples on the left and the result on the
right; narrower, one column: input, result, examples. The per-head gallery keeps its images at
every width. Explanatory text uses the body text colour (contrast above 4.5:1 on the theme's
background; `tests/test_app_browser.py` measures it).
"""

import html

GALLERY_COLUMNS = 6  # the CSS below fits as many 96-px tiles per row as the width allows
NARROW = 700  # px: below this the page is one column
NARROW_INPUT_HEIGHT = 180  # px: the upload's block in one column, so that the top classes show without scrolling

CSS = f"""
#main {{ display: grid !important; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr);
  grid-template-areas: "input result" "more result"; grid-template-rows: auto 1fr; align-items: start; }}
#input-column {{ grid-area: input; min-width: 0 !important; }}
#result-column {{ grid-area: result; min-width: 0 !important; }}
#more-column {{ grid-area: more; min-width: 0 !important; }}
@media (max-width: {NARROW}px) {{
  #main {{ grid-template-columns: minmax(0, 1fr); grid-template-areas: "input" "result" "more";
    grid-template-rows: auto; }}
  /* On a phone the result comes first: the upload's preview is small. */
  #input-image {{ height: {NARROW_INPUT_HEIGHT}px !important; }}
}}
/* Small inputs (a 28 x 28 upload) fill their box, upscaled pixel for pixel (nearest neighbour). */
.pixel-image img {{ width: 100%; height: 100%; object-fit: contain; image-rendering: pixelated; }}
#overlay img {{ cursor: crosshair; max-height: 320px; }}
/* The overlay's and the gallery's buttons sit above the images, not on the patches one clicks. */
#overlay .image-container > .icon-button-wrapper, #heads .icon-button-wrapper {{ position: static;
  width: fit-content; margin: 0 0 4px auto; }}
/* Labels sit above the images, not on top of them. */
.pixel-image [data-testid="block-label"], #heads [data-testid="block-label"] {{ position: static; margin-bottom: 4px; }}
/* The gallery is as tall as its rows (no blank space under it), captions under the images. */
#heads .grid-wrap {{ height: auto !important; min-height: 0 !important; max-height: none !important;
  overflow: visible; }}
#heads .grid-container {{ padding-top: 0; grid-template-columns: repeat(auto-fit, minmax(96px, 1fr)) !important; }}
#heads .thumbnail-item {{ height: auto; display: flex; flex-direction: column; }}
#heads .thumbnail-item img {{ width: 100%; height: auto; aspect-ratio: 1; image-rendering: pixelated; }}
#heads .caption-label {{ position: static; transform: none; max-width: 100%; margin: 2px auto; white-space: normal;
  overflow: visible; text-overflow: clip; text-align: center; }}
/* The controls wrap instead of overflowing their cards; a slider's number box keeps its width. */
#controls {{ flex-wrap: wrap; }}
#controls > * {{ min-width: 150px !important; flex: 1 1 150px; }}
#controls .head {{ flex-wrap: wrap; gap: 4px; }}
/* Explanatory text in the body colour and size, not the theme's small grey. */
.explain, .explain p, #caption p, #controls-note p {{ color: var(--body-text-color) !important;
  font-size: var(--text-md) !important; }}
#caption > p {{ margin: 0; font-weight: 600; }}
#caption .legend {{ display: flex; align-items: center; gap: 8px; margin: 6px 0; font-size: 0.9em; }}
#caption .legend .bar {{ flex: 1 1 auto; height: 12px; min-width: 80px; border-radius: 2px; }}
#caption details p {{ margin: 4px 0 0; font-weight: 400; }}
#unlike:not(:has(.warning)) {{ display: none; }}  /* no empty space above the classes */
#unlike .warning {{ margin: 0; padding: 8px 12px; border-left: 4px solid #b42318; background: #fef3f2; color: #7a271a;
  font-weight: 600; }}
#unlike .warning summary {{ cursor: pointer; }}
#unlike .warning p {{ margin: 4px 0 0; }}
table.facts {{ width: 100%; border-collapse: collapse; font-size: 0.9em; }}
table.facts caption {{ text-align: left; font-weight: 600; font-size: 1.1em; padding-bottom: 4px; }}
table.facts th {{ text-align: left; font-weight: 600; padding: 2px 12px 2px 0; white-space: nowrap; }}
table.facts td {{ padding: 2px 0; overflow-wrap: anywhere; }}
"""

# 1. Gradio's gallery marks its images loading="lazy"; far down a narrow page (one column)
#    Chromium then leaves them unloaded, and the gallery shows captions without images. They are
#    small, so load them at once.
# 2. A slider's number box applies a typed value on blur only (Gradio 6.31); Enter blurs it, so
#    Enter applies as Tab does. A box left empty (not a number) or unchanged sends nothing: its
#    blur is stopped before Gradio sees it, and an empty box gets its value back. A click into the
#    box sends nothing either (Gradio applies the value on its pointerup). A half-typed number
#    ("1e") is kept from Gradio, which would empty the box under the typing.
HEAD = f"""<style>
/* One toast at a time (the newest), at the foot of a narrow window, off the headline. Here, not in
   CSS: Gradio scopes the CSS to the page's container, and the toasts live outside it. */
.toast-wrap .toast-item:not(:last-child) {{ display: none; }}
@media (max-width: {NARROW}px) {{ .toast-wrap {{ top: auto !important; bottom: 12px; }} }}
</style>"""
HEAD += f"<script>const NARROW = {NARROW};</script>"
HEAD += """<script>
new MutationObserver(() => {
  document.querySelectorAll('#heads img[loading="lazy"]').forEach((img) => { img.loading = "eager"; });
  // In one column the out-of-domain warning is its one-line summary, which opens on a tap.
  if (window.innerWidth <= NARROW) {
    document.querySelectorAll("#unlike details.warning[open]:not([data-seen])").forEach((d) => {
      d.open = false; d.dataset.seen = "1";
    });
  }
}).observe(document.documentElement, {subtree: true, childList: true});
const numberBox = (el) => el instanceof HTMLInputElement && el.type === "number" && el.closest(".clamped");
document.addEventListener("focusin", (e) => {
  if (numberBox(e.target)) e.target.dataset.shown = e.target.value;
}, true);
// A half-typed number ("1e" of "1e1") reads as empty; Gradio would empty the box, and the rest of
// the number would be typed into an empty box. Gradio sees the box again once it holds a number.
document.addEventListener("input", (e) => {
  if (numberBox(e.target) && e.target.validity.badInput) e.stopImmediatePropagation();
}, true);
// Gradio also applies the value when the box is clicked (pointerup), which sends a request for nothing.
document.addEventListener("pointerup", (e) => { if (numberBox(e.target)) e.stopImmediatePropagation(); }, true);
document.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && numberBox(e.target)) { e.preventDefault(); e.target.blur(); }
  // Enter on a dropdown's highlighted option picks it as a click does, so that the keyboard sends
  // the one `select` event that the page listens to (Gradio's own Enter sends `input` only).
  const active = e.key === "Enter" && dropdownBox(e.target)
    && document.querySelector('[role="listbox"] li.item.active');
  if (active) {
    e.preventDefault(); e.stopImmediatePropagation();
    active.dispatchEvent(new MouseEvent("mousedown", {bubbles: true, cancelable: true}));
  }
}, true);
// A slider moved by the keyboard applies its value as a drag's release does (Gradio sends on
// pointerup only): one request per key press, however long the key is held.
const rangeOf = (el) => el instanceof HTMLInputElement && el.type === "range" && el.closest(".clamped");
const SLIDER_KEYS = ["ArrowLeft", "ArrowRight", "ArrowUp", "ArrowDown", "PageUp", "PageDown", "Home", "End"];
document.addEventListener("keyup", (e) => {
  if (rangeOf(e.target) && SLIDER_KEYS.includes(e.key)) {
    e.target.dispatchEvent(new PointerEvent("pointerup", {bubbles: true}));
  }
}, true);
// A dropdown's text is selected when it gets the focus, so that typing replaces it.
const dropdownBox = (el) => el instanceof HTMLInputElement && el.closest("#class-name, #head");
const closeList = (box) => box.dispatchEvent(new KeyboardEvent("keydown", {key: "Escape", bubbles: true}));
document.addEventListener("focusin", (e) => { if (dropdownBox(e.target)) e.target.select(); }, true);
// Leaving a dropdown (Tab) closes its list, which Gradio leaves open after a text it does not know;
// after Gradio's own handling of the blur.
document.addEventListener("focusout", (e) => {
  if (dropdownBox(e.target)) setTimeout(() => { if (document.activeElement !== e.target) closeList(e.target); }, 50);
}, true);
// A click elsewhere closes a list left open.
document.addEventListener("pointerdown", (e) => {
  document.querySelectorAll("#class-name input, #head input").forEach((box) => {
    if (!box.closest(".block").contains(e.target) && !e.target.closest('[role="listbox"]')) closeList(box);
  });
}, true);
document.addEventListener("blur", (e) => {
  const box = e.target;
  if (!numberBox(box)) return;
  const shown = box.dataset.shown;
  if (box.value === "" || box.validity.badInput) {
    box.value = shown;
    box.dispatchEvent(new Event("input", {bubbles: true}));
  }
  if (box.value === shown) e.stopImmediatePropagation();
}, true);
</script>"""

# The image's `change` handler, run in the browser: when the image is emptied, so are the top classes,
# the overlay, its caption and the per-head maps; otherwise nothing changes (undefined: no update).
# Gradio 6.31 drops a whole update when a Label is set to null, hence the empty confidences.
CLEAR_WITH_IMAGE = """(image, ...shown) => image ? shown.map(() => undefined)
  : [{label: null, confidences: []}, null, "", [], ""]"""

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


WARNING_SUMMARY = "Unusual: classes are guesses."


def warning_html(text):
    """The out-of-domain warning as HTML, or "" for no warning: a one-line summary and `text`, open
    (the page's script closes it to the summary in one column)."""
    if not text:
        return ""
    return (f'<details class="warning" role="alert" open><summary>{WARNING_SUMMARY}</summary>'
            f"<p>{html.escape(text)}</p></details>")


def model_facts(model, latency_ms=None, ran_model=True):
    """An HTML table (no header row) of what is being served, and how long the last result took."""
    h, w = model.image_size
    if latency_ms is None:
        latency = "-"
    else:
        latency = f"{latency_ms:.0f} ms" + ("" if ran_model else " (maps redrawn, model not rerun)")
    tokens = " + class token" if model.class_token else ", no class token"
    rows = [
        ("preset", model.preset or "custom"),
        ("resolution", (f"about {h * w:,} px, each upload at its own shape" if model.dynamic_image_size
                        else f"{h} x {w} px") + f", {model.num_channels} channel(s), patch {model.patch_size}"),
        ("tokens", ("one per patch of the upload" if model.dynamic_image_size
                    else f"{model.grid_size[0]} x {model.grid_size[1]} patches") + tokens),
        ("layers x heads", f"{model.num_layers} x {model.num_heads}"),
        ("parameters", f"{model.count_params():,}"),
        ("classes", str(model.num_classes)),
        ("latency of this result", latency),
    ]
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f'<table class="facts"><caption>Model facts</caption>{body}</table>'
