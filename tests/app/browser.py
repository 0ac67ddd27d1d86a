"""Driving the app in a real headless browser: Debian's `chromium` through Python Playwright (browser
downloads are blocked, so Playwright's own builds are never used). The end-to-end tests and the
docs' screenshots (`python -m scripts.app_screenshots`) share these functions.
"""

import contextlib
import io

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
TIMEOUT_MS = 120_000
OVERLAY = "#overlay img"
TOP_ROWS = '#top [data-testid$="-confidence-set"]'


@contextlib.contextmanager
def chromium():
    """A headless Debian chromium, through Playwright."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@contextlib.contextmanager
def app_page(browser, url, width=1300, height=1100, console=None):
    """A new page of `browser` on `url`, once the upload input exists. `console`, a list, gets a
    (type, text) pair for each console message and uncaught error ("pageerror") from the start."""
    page = browser.new_page(viewport={"width": width, "height": height})
    if console is not None:
        page.on("console", lambda m: console.append((m.type, m.text)))
        page.on("pageerror", lambda e: console.append(("pageerror", str(e))))
    try:
        page.goto(url)
        page.wait_for_selector("input[type=file]", state="attached", timeout=TIMEOUT_MS)
        yield page
    finally:
        page.close()


def classify(page, path):
    """Uploads `path` and waits for the top-5 labels and the overlay; returns the label names."""
    before = overlay_src(page)
    page.locator("input[type=file]").first.set_input_files(str(path))
    page.wait_for_function(f"document.querySelectorAll('{TOP_ROWS}').length === 5", timeout=TIMEOUT_MS)
    wait_for_new_overlay(page, before)
    return top_classes(page)


def top_classes(page):
    return [s.get_attribute("data-testid").removesuffix("-confidence-set") for s in page.locator(TOP_ROWS).all()]


def overlay_src(page):
    """The overlay image's URL, or None."""
    return page.evaluate(f"document.querySelector('{OVERLAY}')?.getAttribute('src') ?? null")


def wait_for_new_overlay(page, before):
    """Waits until the overlay shows an image other than `before` (a URL or None), fully loaded."""
    page.wait_for_function(
        f"old => {{ const i = document.querySelector('{OVERLAY}'); "
        "return i && i.getAttribute('src') !== old && i.complete && i.naturalWidth > 0; }",
        arg=before, timeout=TIMEOUT_MS,
    )


def click_example(page, index):
    """Clicks the `index`-th example and waits until a new overlay has arrived."""
    before = overlay_src(page)
    page.locator("button.gallery-item").nth(index).click()
    wait_for_new_overlay(page, before)


def click_class(page, index):
    """Clicks the `index`-th of the top classes and waits for its map."""
    before = overlay_src(page)
    page.locator(TOP_ROWS).nth(index).click()
    wait_for_new_overlay(page, before)


def click_patch(page, row, column, grid_size):
    """Clicks the center of patch (row, column) (0-based) of the overlay, which shows an (h, w) grid
    scaled to fit its box (object-fit: contain); waits for the map."""
    before = overlay_src(page)
    image = page.locator(OVERLAY)
    x, y = image.evaluate(
        """(i, [r, c, h, w]) => { const b = i.getBoundingClientRect();
          const s = Math.min(b.width / i.naturalWidth, b.height / i.naturalHeight);
          const [cw, ch] = [i.naturalWidth * s, i.naturalHeight * s];
          return [(b.width - cw) / 2 + (c + 0.5) * cw / w, (b.height - ch) / 2 + (r + 0.5) * ch / h]; }""",
        [row, column, *grid_size])
    image.click(position={"x": x, "y": y})
    wait_for_new_overlay(page, before)


def overlay_pixels(page):
    """The overlay as a (S, S', 3) uint8 array, downloaded as the browser shows it."""
    import numpy as np
    from PIL import Image

    reply = page.request.get(page.locator(OVERLAY).evaluate("i => i.src"))
    return np.asarray(Image.open(io.BytesIO(reply.body())).convert("RGB"))


def caption(page):
    return page.locator("#caption").inner_text().strip()


def error_toast(page, path):
    """Uploads `path` and returns the text of the toast that refuses it."""
    page.locator("input[type=file]").first.set_input_files(str(path))
    toast = page.locator('[data-testid="toast-body"]').last
    toast.wait_for(timeout=TIMEOUT_MS)
    return toast.inner_text()


def count_queue_joins(page):
    """A list that grows by one URL per `/queue/join` request the page sends (one per event run)."""
    joins = []
    page.on("request", lambda request: joins.append(request.url) if "/queue/join" in request.url else None)
    return joins


def gallery_images(page):
    """(naturalWidth, naturalHeight) of each per-head gallery image, once all have loaded."""
    script = "[...document.querySelectorAll('#heads img')]"
    page.wait_for_function(f"{script}.length > 0 && {script}.every(i => i.complete && i.naturalWidth > 0)",
                           timeout=TIMEOUT_MS)
    return page.evaluate(f"{script}.map(i => [i.naturalWidth, i.naturalHeight])")


def box(page, selector):
    """The bounding box {x, y, width, height} of the first element matching `selector`, in page
    coordinates (scrolling included), or None when it is not shown."""
    return page.evaluate(
        "s => { const e = document.querySelector(s); if (!e || !e.offsetParent) return null; "
        "const r = e.getBoundingClientRect(); "
        "return {x: r.x + scrollX, y: r.y + scrollY, width: r.width, height: r.height}; }", selector)


# WCAG 2's contrast ratio of an element's text colour against the first opaque background behind it.
CONTRAST = """e => {
  const rgb = (c) => c.match(/[\\d.]+/g).map(Number);
  const lum = ([r, g, b]) => [r, g, b]
    .map((v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; })
    .reduce((s, v, i) => s + v * [0.2126, 0.7152, 0.0722][i], 0);
  let bg = e;
  while (bg && (getComputedStyle(bg).backgroundColor === "rgba(0, 0, 0, 0)"
                || rgb(getComputedStyle(bg).backgroundColor)[3] === 0))
    bg = bg.parentElement;
  const [a, b] = [lum(rgb(getComputedStyle(e).color)),
                  lum(rgb(bg ? getComputedStyle(bg).backgroundColor : "rgb(255,255,255)"))];
  return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
}"""


def contrast(page, selector):
    """The lowest text contrast among the elements matching `selector`."""
    return min(page.locator(selector).evaluate_all(f"es => es.map({CONTRAST})"))
