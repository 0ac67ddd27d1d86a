"""End to end in a real browser: Debian's headless chromium, driven by Python Playwright."""

import os

import pytest

from PIL import Image

from apps.browser import (CHROMIUM, chromium_page, classify, click_example, count_queue_joins, error_toast,
                          gallery_images, screenshots)
from apps.checkpoint import DEFAULT_CHECKPOINT, class_labels, load_model
from apps.demo import example_images, launch
from apps.inference import HEAD_SIZE
from apps.ui import TITLE, build_demo
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


def test_one_request_per_upload_example_and_setting(tmp_path):
    demo, url = serve(tiny_classifier(1), NAMES)
    try:
        with chromium_page(url) as page:
            joins = count_queue_joins(page)
            classify(page, example_images()[0])
            page.wait_for_timeout(1000)  # a second request would come within this
            assert len(joins) == 1
            classify(page, example_images()[3])  # replaces the shown image
            page.wait_for_timeout(1000)
            assert len(joins) == 2
            click_example(page, 2)
            page.wait_for_timeout(1000)
            assert len(joins) == 3
            page.get_by_label("class-token attention").check()  # a setting: redrawn, model not rerun
            page.wait_for_function("document.querySelector('#facts').innerText.includes('not rerun')")
            page.wait_for_timeout(1000)
            assert len(joins) == 4
    finally:
        demo.close()


def test_a_refused_file_gives_one_toast_and_no_error_badge(tmp_path):
    demo, url = serve(tiny_classifier(1), NAMES)
    (tmp_path / "notes.png").write_bytes(b"not an image\n" * 100)
    try:
        with chromium_page(url) as page:
            classify(page, example_images()[0])
            text = error_toast(page, tmp_path / "notes.png")
            page.wait_for_timeout(1500)
            assert page.locator('[data-testid="toast-body"]').count() == 1
            assert TITLE in text and "not an image" in text and "(2)" not in text
            assert page.locator('[data-testid="status-tracker"].error').count() == 0  # no "Error" badges
            assert page.locator('img[src*="overlay.png"]').count() == 0  # the panes were cleared
    finally:
        demo.close()


def test_narrow_and_wide_pages_show_the_gallery_images(tmp_path):
    model = load_model(DEFAULT_CHECKPOINT)
    demo = build_demo(model, class_labels(model), examples=example_images())  # all examples: a long page
    _, url, _ = launch(demo, port=free_port(), prevent_thread_lock=True, quiet=True)
    try:
        with chromium_page(url, width=400, height=900) as page:
            classify(page, example_images()[0])
            sizes = gallery_images(page)  # loaded without scrolling to them
            assert sizes == [[HEAD_SIZE, HEAD_SIZE]] * model.num_heads
            shown = page.evaluate("[...document.querySelectorAll('#heads img')].map(i => i.clientWidth)")
            assert min(shown) >= 90
            upload = page.evaluate("document.querySelector('#input-image img').clientWidth")
            assert upload >= 5 * model.image_size[1]  # a 28-px image is upscaled, not a speck
        paths = screenshots(url, example_images()[0], tmp_path)
        assert [Image.open(p).size[0] for p in paths] == [400, 1400]
    finally:
        demo.close()
