"""Driving the app in a real headless browser: Debian's `chromium` through Python Playwright (browser
downloads are blocked, so Playwright's own builds are never used). The end-to-end tests and the
README screenshots share these functions.

    python -m apps.browser --image apps/assets/photo-style-0035-t-shirt-top.png   # docs/app-{400,1400}.png
"""

import argparse
import contextlib

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
TIMEOUT_MS = 120_000


@contextlib.contextmanager
def chromium_page(url, width=1300, height=1100):
    """A Playwright page on `url`, in headless Debian chromium, once the upload input exists."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.goto(url)
            page.wait_for_selector("input[type=file]", state="attached", timeout=TIMEOUT_MS)
            yield page
        finally:
            browser.close()


def classify(page, path):
    """Uploads `path` and waits for the top-5 labels and the overlay; returns the label names."""
    page.locator("input[type=file]").first.set_input_files(str(path))
    sets = page.locator('[data-testid$="-confidence-set"]')
    page.wait_for_function("document.querySelectorAll('[data-testid$=\"-confidence-set\"]').length === 5", timeout=TIMEOUT_MS)
    overlay = page.locator('img[src*="overlay.png"]')
    overlay.wait_for(timeout=TIMEOUT_MS)
    page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=overlay.element_handle(), timeout=TIMEOUT_MS)
    return [s.get_attribute("data-testid").removesuffix("-confidence-set") for s in sets.all()]


def click_example(page, index):
    """Clicks the `index`-th example and waits until a new overlay has arrived."""
    before = page.locator('img[src*="overlay.png"]').first.get_attribute("src")
    page.locator("button.gallery-item").nth(index).click()
    page.wait_for_function(
        "old => [...document.querySelectorAll('img[src*=\"overlay.png\"]')].some(i => i.src !== old && i.complete)",
        arg=before,
        timeout=TIMEOUT_MS,
    )


def error_toast(page, path):
    """Uploads `path` and returns the text of the toast that refuses it."""
    page.locator("input[type=file]").first.set_input_files(str(path))
    toast = page.locator('[data-testid="toast-body"]').first
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


def screenshots(url, image, out_dir, widths=(400, 1400)):
    """Full-page screenshots of the app after classifying `image`, one per viewport width; returns
    the paths (out_dir/app-WIDTH.png)."""
    paths = []
    for width in widths:
        with chromium_page(url, width=width, height=900) as page:
            classify(page, image)
            gallery_images(page)
            paths.append(f"{out_dir}/app-{width}.png")
            page.screenshot(path=paths[-1], full_page=True)
    return paths


def main(argv=None):
    from apps.checkpoint import DEFAULT_CHECKPOINT, class_labels, load_model
    from apps.demo import example_images, launch
    from apps.ui import build_demo
    from training import cli

    p = cli.parser("python -m apps.browser", "Screenshots of the app classifying one image, at 400 and 1400 px.")
    p.add_argument("--checkpoint", default=str(DEFAULT_CHECKPOINT), help="the checkpoint to serve")
    p.add_argument("--image", required=True, help="the image to upload")
    p.add_argument("--out", default="docs", help="folder for app-400.png and app-1400.png")
    p.add_argument("--port", type=int, default=7861, help="port of the app while it is shot")
    args = p.parse_args(argv)
    model = load_model(args.checkpoint)
    demo = build_demo(model, class_labels(model), examples=example_images())
    _, url, _ = launch(demo, port=args.port, prevent_thread_lock=True, quiet=True)
    try:
        for path in screenshots(url, args.image, args.out):
            print(f"wrote {path}")
    finally:
        demo.close()


if __name__ == "__main__":
    main()
