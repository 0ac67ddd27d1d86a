"""Driving the app in a real headless browser: Debian's `chromium` through Python Playwright (browser
downloads are blocked, so Playwright's own builds are never used). The end-to-end test and the
README screenshot share these functions.

    python -m apps.browser --image apps/assets/photo-style-0035-t-shirt-top.png --out docs/app.png
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
    """Uploads `path` and returns the text of the error toast that it raises."""
    page.locator("input[type=file]").first.set_input_files(str(path))
    toast = page.locator('[data-testid="toast-body"].error').first
    toast.wait_for(timeout=TIMEOUT_MS)
    return toast.inner_text()


def main(argv=None):
    from apps.checkpoint import DEFAULT_CHECKPOINT, class_labels, load_model
    from apps.demo import example_images, launch
    from apps.ui import build_demo

    p = argparse.ArgumentParser(description="Screenshot of the app classifying one image.")
    p.add_argument("--checkpoint", default=str(DEFAULT_CHECKPOINT))
    p.add_argument("--image", required=True)
    p.add_argument("--out", default="docs/app.png")
    p.add_argument("--port", type=int, default=7861)
    args = p.parse_args(argv)
    model = load_model(args.checkpoint)
    demo = build_demo(model, class_labels(model), examples=example_images())
    _, url, _ = launch(demo, port=args.port, prevent_thread_lock=True, quiet=True)
    try:
        with chromium_page(url) as page:
            print("top 5:", classify(page, args.image))
            page.screenshot(path=args.out, full_page=True)
    finally:
        demo.close()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
