"""Screenshots of the app classifying one image, at 400 and 1400 px wide, for the docs:

    python -m scripts.app_screenshots --image apps/assets/photo-style-0035-t-shirt-top.png   # docs/app-{400,1400}.png

It drives Debian's chromium with the end-to-end tests' functions (tests/app/browser.py).
"""

from tests.app.browser import app_page, chromium, classify


def screenshots(browser, url, image, out_dir, widths=(400, 1400)):
    """Full-page screenshots of the app after classifying `image`, one per viewport width; returns
    the paths (out_dir/app-WIDTH.png)."""
    paths = []
    for width in widths:
        with app_page(browser, url, width=width, height=900) as page:
            classify(page, image)
            paths.append(f"{out_dir}/app-{width}.png")
            page.screenshot(path=paths[-1], full_page=True)
    return paths


def main(argv=None):
    from apps.sources import DEFAULT_CHECKPOINT, class_labels, load_model, ood_stats
    from apps.demo import launch
    from apps.sources import find_examples
    from apps.ui import build_demo
    from commands import cli

    p = cli.parser("python -m scripts.app_screenshots",
                   "Screenshots of the app classifying one image, at 400 and 1400 px.")
    p.add_argument("--checkpoint", default=str(DEFAULT_CHECKPOINT), help="the checkpoint to serve")
    p.add_argument("--image", required=True, help="the image to upload")
    p.add_argument("--out", default="docs", help="folder for app-400.png and app-1400.png")
    p.add_argument("--port", type=int, default=7861, help="port of the app while it is shot")
    args = p.parse_args(argv)
    model = load_model(args.checkpoint)
    labels = class_labels(model)
    demo = build_demo(model, labels, find_examples(args.checkpoint, labels), ood_stats(args.checkpoint, model))
    _, url, _ = launch(demo, port=args.port, prevent_thread_lock=True, quiet=True)
    try:
        with chromium() as browser:
            for path in screenshots(browser, url, args.image, args.out):
                print(f"wrote {path}")
    finally:
        demo.close()


if __name__ == "__main__":
    main()
