"""End to end in a real browser: Debian's headless chromium, driven by Python Playwright."""

import os
from pathlib import Path

import pytest

from apps.browser import CHROMIUM, chromium_page, classify, click_example, error_toast
from apps.checkpoint import DEFAULT_CHECKPOINT, class_labels, load_model
from apps.demo import example_images, launch
from apps.ui import build_demo
from test_app_helpers import NAMES, free_port, png_header_only, tiny_classifier

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True, scope="module")
def _chromium_installed():
    # A missing browser is a failed test, not a skip: .ci/run installs Debian's chromium.
    assert os.path.exists(CHROMIUM), f"{CHROMIUM} is missing: apt-get install chromium"


def serve(model, labels):
    demo = build_demo(model, labels, examples=example_images()[:6])
    _, url, _ = launch(demo, port=free_port(), prevent_thread_lock=True, quiet=True)
    return demo, url


def test_upload_classify_and_refuse_hostile_files(tmp_path):
    demo, url = serve(tiny_classifier(1), NAMES)
    try:
        with chromium_page(url) as page:
            labels = classify(page, example_images()[0])
            assert len(labels) == 5 and set(labels) <= set(NAMES)
            click_example(page, 2)
            page.screenshot(path=tmp_path / "app.png", full_page=True)
            assert (tmp_path / "app.png").stat().st_size > 10_000
            (tmp_path / "empty.png").write_bytes(b"")
            assert "not an image" in error_toast(page, tmp_path / "empty.png")
            page.reload()
            page.wait_for_selector("input[type=file]", state="attached")
            (tmp_path / "bomb.png").write_bytes(png_header_only(20000, 20000))
            assert "50 MP" in error_toast(page, tmp_path / "bomb.png")
            page.reload()
            page.wait_for_selector("input[type=file]", state="attached")
            assert len(classify(page, example_images()[1])) == 5  # the server is still up
    finally:
        demo.close()


def test_shipped_checkpoint_in_the_browser(tmp_path):
    model = load_model(DEFAULT_CHECKPOINT)
    demo, url = serve(model, class_labels(model))
    try:
        with chromium_page(url) as page:
            for path in example_images()[:2]:
                labels = classify(page, path)
                assert len(labels) == 5 and set(labels) <= set(model.class_names)
    finally:
        demo.close()
