"""End to end in a real browser: Debian's headless chromium, driven by Python Playwright. One browser
and two servers (the shipped model with its Fashion-MNIST examples; a model of other classes with a
folder of examples) serve every test of the module."""

import os

import numpy as np
import pytest
from PIL import Image

import keras_vit

from tests.app.browser import (CHROMIUM, app_page, box, caption, chromium, classify, click_class, click_example,
                          click_patch, contrast, count_queue_joins, error_toast, gallery_images, overlay_pixels,
                          overlay_src, top_classes, wait_for_new_overlay, TIMEOUT_MS)
from apps.sources import DEFAULT_CHECKPOINT, class_labels, ood_stats
from apps.demo import launch
from apps.sources import find_examples, fashion_mnist_examples
from apps.inference import HEAD_SIZE, OVERLAY_SIZE
from apps.images import OUTLINE_COLOR
from apps.ui import TITLE, build_demo
from tests.conftest import randomize
from tests.app.test_app_helpers import free_port

pytestmark = pytest.mark.slow
PHOTO = fashion_mnist_examples()[-1]  # a photo-style T-shirt
OTHER_CLASSES = ["cat", "flower", "rocket", "dog", "car", "tree"]
BADGES = '[data-testid="status-tracker"].error'
TOASTS = '[data-testid="toast-body"]'


@pytest.fixture(scope="module")
def browser():
    # A missing browser is a failed test, not a skip: .ci/run installs Debian's chromium.
    assert os.path.exists(CHROMIUM), f"{CHROMIUM} is missing: apt-get install chromium"
    with chromium() as b:
        yield b


def serve(model, labels, examples, ood=None):
    demo = build_demo(model, labels, examples, ood)
    _, url, _ = launch(demo, port=free_port(), prevent_thread_lock=True, quiet=True)
    return demo, url


@pytest.fixture(scope="module")
def shipped_model():
    return keras_vit.load(DEFAULT_CHECKPOINT)


@pytest.fixture(scope="module")
def shipped(shipped_model):
    labels = class_labels(shipped_model)
    demo, url = serve(shipped_model, labels, find_examples(DEFAULT_CHECKPOINT, labels),
                      ood_stats(DEFAULT_CHECKPOINT, shipped_model))
    yield url
    demo.close()


@pytest.fixture(scope="module")
def other(shipped_model, tmp_path_factory):
    """A model of six other classes, served with a folder of class sub-folders as its examples. It
    has the shipped model's blocks, so JAX reuses what it compiled for that one."""
    folder = tmp_path_factory.mktemp("photos")
    for c, name in enumerate(OTHER_CLASSES[:3]):
        (folder / name).mkdir()
        for i in range(2):
            color = np.random.default_rng(10 * c + i).integers(0, 256, 3)
            Image.fromarray(np.full((40, 40, 3), color, "uint8")).save(folder / name / f"{i}.png")
    config = shipped_model.get_config() | dict(num_channels=3, image_mean=(0.5,) * 3, image_std=(0.5,) * 3,
                                               num_classes=6, class_names=OTHER_CLASSES)
    model = randomize(keras_vit.ViT.from_config(config), scale=0.1)
    demo, url = serve(model, OTHER_CLASSES, find_examples("model.keras", OTHER_CLASSES, folder))
    yield url
    demo.close()


@pytest.fixture(scope="module")
def naflex(shipped_model, tmp_path_factory):
    """A patch-sequence model (max_seq_len=24; the shipped model's blocks, random weights) saved as a
    .keras file and served as `python -m apps.demo --checkpoint naflex.keras` serves it."""
    from apps.demo import _build, parse_args

    config = shipped_model.get_config() | dict(num_channels=3, image_mean=(0.5,) * 3, image_std=(0.5,) * 3,
                                               num_classes=6, class_names=OTHER_CLASSES, max_seq_len=NAFLEX_BUDGET)
    path = tmp_path_factory.mktemp("naflex") / "naflex.keras"
    randomize(keras_vit.ViT.from_config(config), scale=0.1).save(path)
    demo, model, _ = _build(parse_args(["--checkpoint", str(path)]))
    assert model.max_seq_len == NAFLEX_BUDGET
    _, url, _ = launch(demo, port=free_port(), prevent_thread_lock=True, quiet=True)
    yield url, model.patch_size
    demo.close()


NAFLEX_BUDGET = 24


def shows(page, text, start=False):
    """Whether the caption shows `text` (at its start, with `start`) within 15 s: an answer sent
    can land after `settle` has counted its request, when the machine is busy."""
    for _ in range(150):
        shown = caption(page)
        if shown.startswith(text) if start else text in shown:
            return True
        page.wait_for_timeout(100)
    print("caption:", caption(page))
    return False


def settle(page, joins, expected):
    """Waits for any late request, then checks that `expected` requests were sent in all."""
    page.wait_for_timeout(800)
    assert len(joins) == expected, joins


def test_class_click_and_patch_click_send_one_request_each(browser, shipped):
    with app_page(browser, shipped, width=1400) as page:
        joins = count_queue_joins(page)
        names = classify(page, PHOTO)
        settle(page, joins, 1)
        assert names[0] == "T-shirt/top" and caption(page).startswith("Why T-shirt/top (")
        first = overlay_pixels(page)
        click_class(page, 1)
        settle(page, joins, 2)
        assert caption(page).startswith(f"Why {names[1]} (") and "Chefer" not in caption(page)
        # A colour legend under the caption, and the method behind "How is this computed?".
        legend = page.inner_text("#caption .legend")
        assert "no relevance" in legend and "the top class's strongest patch" in legend
        assert box(page, "#caption .legend .bar")["width"] >= 80
        page.click("#caption summary")
        assert "Chefer" in caption(page) and "one scale across the classes" in caption(page)
        assert page.locator("#class-name input").input_value() == names[1]
        second = overlay_pixels(page)
        assert np.abs(first.astype(int) - second.astype(int)).mean() > 2  # the top-2 map is another map
        # On the shared scale the less likely class's map is the darker one.
        assert second.mean() < first.mean()
        click_patch(page, 1, 4, (7, 7))
        settle(page, joins, 3)
        assert caption(page).startswith("Where the outlined patch (row 2, column 5) looks: its attention in layer 6")
        cell = OVERLAY_SIZE / 7
        assert tuple(overlay_pixels(page)[round(cell), round(4.5 * cell)]) == OUTLINE_COLOR  # the patch's top edge
        assert gallery_images(page) == [[HEAD_SIZE, HEAD_SIZE]] * 4  # where that patch looks, per head
        assert not page.locator("#layer input[type=range]").is_disabled()
        page.get_by_label("rollout", exact=True).check()
        page.wait_for_function("document.querySelector('#caption').innerText.startsWith('Attention rollout')")
        settle(page, joins, 4)
        assert page.locator("#layer input[type=range]").is_disabled() and page.locator("#head input").is_disabled()
        assert ("Layer and head are off: the rollout map combines all layers and heads"
                in page.inner_text("#controls-note"))
        assert page.locator("#heads").count() == 0 or box(page, "#heads") is None  # no per-head maps for rollout


def clear(page, field):
    """Empties a number box the way a user does (select all, Backspace) and checks that it is empty:
    a click's caret and Control+A race Gradio's re-render of the box, and a box left holding "1"
    turns a typed "2.5" into "12.5". The check waits, since the answer to the previous request
    can land after the Backspace and put the value back."""
    for _ in range(3):
        field.select_text()
        page.keyboard.press("Backspace")
        page.wait_for_timeout(300)
        if field.input_value() == "":
            return
        page.wait_for_timeout(200)
    raise AssertionError(f"the box still holds {field.input_value()!r} after select-all and Backspace")


@pytest.mark.parametrize("width", [400, 1400])  # the same at every width
def test_typed_layer_and_opacity_cannot_break_the_page(browser, shipped, capfd, width):
    with app_page(browser, shipped, width=width) as page:
        classify(page, PHOTO)
        page.get_by_label("patch attention", exact=True).check()
        page.wait_for_function("document.querySelector('#caption').innerText.startsWith('Where')")
        joins = count_queue_joins(page)
        layer, opacity = page.locator("#layer input[type=number]"), page.locator("#opacity input[type=number]")
        steps = [  # (box, typed, key, requests, shown)
            (layer, "3", "Enter", 1, "3"), (layer, "9", "Enter", 1, "6"), (layer, "0", "Tab", 1, "1"),
            (layer, "2.5", "Enter", 1, "3"), (layer, "abc", "Enter", 0, "3"), (layer, "", "Tab", 0, "3"),
            (layer, "3", "Enter", 0, "3"), (layer, "1e1", "Enter", 1, "6"), (layer, "4", "Tab", 1, "4"),
            (opacity, "2", "Enter", 1, "1"), (opacity, "-1", "Tab", 1, "0"),
        ]
        sent = 0
        for field, typed, key, requests, shown in steps:
            clear(page, field)
            page.keyboard.type(typed)
            page.keyboard.press(key)
            sent += requests
            settle(page, joins, sent)
            assert field.input_value() == shown, (typed, key)
            if field is layer:
                assert shows(page, f"in layer {shown},"), typed
        assert page.locator(TOASTS).count() == 0 and page.locator(BADGES).count() == 0
    assert "Traceback" not in capfd.readouterr().err


def test_dropdowns_slider_keys_and_the_overlay_corner_send_one_request_per_action(browser, shipped):
    with app_page(browser, shipped, width=400, height=1200) as page:
        names = classify(page, PHOTO)
        joins = count_queue_joins(page)
        box_ = page.locator("#class-name input")
        box_.click()
        page.get_by_role("option", name=names[3], exact=True).click()  # the mouse: one request, not two
        settle(page, joins, 1)
        assert shows(page, f"Why {names[3]} (", start=True) and box_.input_value() == names[3]
        box_.click()  # the keyboard: the text is selected, arrows move, Enter picks
        assert page.evaluate("document.activeElement.selectionEnd - document.activeElement.selectionStart") == len(
            names[3])
        page.get_by_role("listbox").wait_for()
        page.keyboard.press("ArrowDown")
        page.wait_for_function(f"document.querySelector('[role=listbox] li.item.active')?.ariaLabel !== {names[3]!r}")
        page.keyboard.press("Enter")
        settle(page, joins, 2)
        picked = box_.input_value()
        assert picked != names[3] and shows(page, f"Why {picked} (", start=True)
        page.keyboard.press("Tab")  # leaving it sends nothing
        settle(page, joins, 2)
        box_.click()
        page.keyboard.type("Xyz")  # typing replaces the text
        assert box_.input_value() == "Xyz"
        # Enter as a user presses it, once the list shows that no class matches (under load the list
        # can lag the keys, and Enter then picks the option still highlighted).
        page.wait_for_function("!document.querySelector('[role=listbox] li.item.active')")
        page.keyboard.press("Enter")
        page.keyboard.press("Tab")
        settle(page, joins, 2)
        assert page.get_by_role("listbox").count() == 0 and box_.input_value() == picked  # closed, the class back
        page.get_by_label("patch attention", exact=True).check()
        settle(page, joins, 3)
        page.focus("#layer input[type=range]")
        for shown in (5, 4):  # each arrow key applies, as a drag's release does
            page.keyboard.press("ArrowLeft")
            settle(page, joins, 3 + (6 - shown))
            assert page.locator("#layer input[type=number]").input_value() == str(shown)
            assert shows(page, f"in layer {shown},")
        page.locator("#head input").click()
        page.get_by_role("option", name="2", exact=True).click()
        settle(page, joins, 6)
        assert shows(page, "layer 4, head 2")
        # The overlay's buttons sit above the image: its top-right patch takes the click.
        image, buttons = box(page, "#overlay img"), box(page, "#overlay .image-container > .icon-button-wrapper")
        assert buttons["y"] + buttons["height"] <= image["y"], (buttons, image)
        click_patch(page, 0, 6, (7, 7))
        settle(page, joins, 7)
        assert caption(page).startswith("Where the outlined patch (row 1, column 7) looks")
        tiles, tools = box(page, "#heads .grid-wrap"), page.locator("#heads .icon-button-wrapper")
        if tools.count():
            assert tools.first.bounding_box()["y"] + tools.first.bounding_box()["height"] <= tiles["y"]


def test_slider_keys_pressed_while_an_answer_is_pending_end_on_what_the_slider_shows(browser, shipped):
    # Three presses in a row: the second and third come while the first one's answer is pending.
    with app_page(browser, shipped, width=1400) as page:
        classify(page, PHOTO)
        page.get_by_label("patch attention", exact=True).check()
        assert shows(page, "in layer 6,")
        page.focus("#layer input[type=range]")
        for _ in range(3):
            page.keyboard.press("ArrowLeft")
        number = page.locator("#layer input[type=number]")
        assert number.input_value() == "3" and page.locator("#layer input[type=range]").input_value() == "3"
        assert shows(page, "in layer 3,"), caption(page)


def test_the_console_shows_no_error_or_warning(browser, shipped):
    # Gradio 6.31 logs "Method not implemented." twice per upload (its upload progress closes a
    # stream whose close() only warns); the page's script keeps that one line out, and nothing else.
    console = []
    with app_page(browser, shipped, width=1400, console=console) as page:
        classify(page, PHOTO)
        page.get_by_label("rollout", exact=True).check()  # a control: one more request
        assert shows(page, "Attention rollout", start=True)
        before = overlay_src(page)
        page.focus("#opacity input[type=range]")
        page.keyboard.press("ArrowRight")
        wait_for_new_overlay(page, before)
        page.evaluate("console.warn('keras_vit test: a warning')")  # the page's other warnings still show
        page.wait_for_timeout(500)
    probe = ("warning", "keras_vit test: a warning")
    assert probe in console, console
    assert not [m for m in console if "Method not implemented" in m[1]], console
    assert not [m for m in console if m[0] in ("warning", "error", "pageerror") and m != probe], console


def check_layout(page, width):
    """Element boxes at one width: one column below 700 px, two above; nothing wider than the window."""
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    image, top, overlay, more = (box(page, s) for s in ("#input-image", "#top", "#overlay", "#more-column"))
    if width < 700:  # the classes right under the image (and its checkbox), the overlay and examples after them
        assert abs(top["x"] - image["x"]) < 2 and 0 < top["y"] - (image["y"] + image["height"]) < 120
        assert overlay["y"] < more["y"]
    else:  # the overlay beside the image; the classes, then the examples, under the image
        assert overlay["x"] >= image["x"] + image["width"] and abs(overlay["y"] - image["y"]) < 10
        assert abs(top["x"] - image["x"]) < 2 and top["y"] > image["y"] + image["height"]
        assert more["y"] > top["y"] + top["height"] and more["x"] < overlay["x"]
    for block in ("#overlay", "#input-image"):  # each image whole inside its block
        outer, inner = box(page, block), box(page, f"{block} img")
        assert outer["y"] <= inner["y"] and inner["y"] + inner["height"] <= outer["y"] + outer["height"] + 1, block
        # In one column the upload's preview is small, so that the result comes first.
        assert inner["height"] >= (120 if width < 700 and block == "#input-image" else 250), block
    for slider in ("#layer", "#opacity"):
        outer = box(page, slider)
        for part in ("input[type=range]", "input[type=number]"):
            inner = box(page, f"{slider} {part}")
            assert outer["x"] - 1 <= inner["x"] and inner["x"] + inner["width"] <= outer["x"] + outer["width"] + 1
    cut = page.evaluate("[...document.querySelectorAll('#heads .caption-label')]"
                        ".filter(e => e.scrollWidth > e.clientWidth).length")
    assert cut == 0 and len(gallery_images(page)) == 4
    assert contrast(page, ".explain p, #caption p, #controls-note p") >= 4.5


def test_layout_at_400_800_and_1400_px(browser, shipped, tmp_path):
    for width in (400, 800, 1400):
        with app_page(browser, shipped, width=width, height=900) as page:
            classify(page, PHOTO)
            click_patch(page, 3, 3, (7, 7))  # the patch view: sliders on, per-head maps shown
            check_layout(page, width)
            page.screenshot(path=tmp_path / f"app-{width}.png", full_page=True)
            page.get_by_role("tab", name="What the model learned").click()
            page.locator("#distance-plot img").wait_for()
            position, distance = box(page, "#position-plot"), box(page, "#distance-plot")
            if width < 860:  # stacked, each the width of the page
                assert distance["y"] >= position["y"] + position["height"] and distance["width"] >= width - 80
            else:
                assert abs(distance["y"] - position["y"]) < 2 and distance["x"] > position["x"]
    assert Image.open(tmp_path / "app-400.png").size[0] == 400


def test_the_top_class_and_the_overlay_are_in_view(browser, shipped, tmp_path):
    """At 800 x 900 and 1400 x 900 the overlay, its caption and its legend show without scrolling,
    with and without a warning; at 400 x 800 the top class shows, and the overlay follows directly
    below the classes."""
    import skimage.data

    astronaut = tmp_path / "astronaut.png"
    Image.fromarray(skimage.data.astronaut()).save(astronaut)
    for width, height in ((400, 800), (800, 900), (1400, 900)):
        with app_page(browser, shipped, width=width, height=height) as page:
            for image, unusual in ((PHOTO, False), (astronaut, True)):
                classify(page, image)
                assert (page.locator("#unlike .warning").count() == 1) == unusual
                assert page.evaluate("scrollY") == 0
                if width <= 700:  # one column
                    first, top, overlay = box(page, "#top .output-class"), box(page, "#top"), box(page, "#overlay")
                    assert first["y"] + first["height"] <= height, (image, first)
                    assert 0 <= overlay["y"] - (top["y"] + top["height"]) <= 20, (image, top, overlay)  # the gap
                    continue
                for part in ("#overlay img", "#caption p", "#caption .legend"):
                    shown = box(page, part)
                    assert 0 <= shown["y"] and shown["y"] + shown["height"] <= height, (width, image, part, shown)


def test_refused_uploads_give_one_toast_and_clear_the_result(browser, shipped, tmp_path):
    (tmp_path / "notes.png").write_bytes(b"not an image\n" * 100)
    (tmp_path / "huge.png").write_bytes(b"\0" * 30_000_000)  # over the 25 MiB limit: refused in the browser
    import skimage.data

    astronaut = tmp_path / "astronaut.png"
    Image.fromarray(skimage.data.astronaut()).save(astronaut)
    with app_page(browser, shipped, width=400, height=900) as page:
        classify(page, astronaut)  # unlike the training data: a warning above the classes
        warning, top = box(page, "#unlike .warning"), box(page, "#top")
        said = page.inner_text("#unlike").strip()
        # One plain sentence, said once, with a percentile of held-out training images: no raw score,
        # no threshold.
        assert said.startswith("This image is less like the training images than") and "score" not in said, said
        assert said.endswith("so these classes are guesses.") and said.count("guess") == 1 and "\n" not in said
        assert "threshold" not in said
        assert warning["y"] < top["y"] and contrast(page, "#unlike .warning") >= 4.5
        classify(page, PHOTO)
        assert page.inner_text("#unlike").strip() == ""
        text = error_toast(page, tmp_path / "notes.png")
        page.wait_for_timeout(1000)
        assert TITLE in text and "not an image" in text and page.locator(TOASTS).count() == 1
        assert page.locator(BADGES).count() == 0 and overlay_src(page) is None and top_classes(page) == []
        page.wait_for_function("!document.querySelector('#input-image img')")  # the refused file is not kept
        assert page.locator("#input-image img").count() == 0
        classify(page, PHOTO)
        joins = count_queue_joins(page)
        assert "exceed the maximum allowed size" in error_toast(page, tmp_path / "huge.png")
        page.wait_for_timeout(1000)
        assert joins == [] and overlay_src(page) is None and top_classes(page) == []  # cleared in the browser
        assert caption(page) == ""
        visible = page.locator(TOASTS).evaluate_all("ts => ts.filter(t => t.offsetParent).length")
        toast, title = page.locator(TOASTS).last.bounding_box(), page.locator("h1").bounding_box()
        assert visible == 1 and toast["y"] > title["y"] + title["height"]  # one toast, off the headline


def test_a_new_upload_closes_the_toast_and_note_of_a_refused_one(browser, shipped, tmp_path):
    """A refused file, then a good one, in the patch view: once the result shows, no toast of the
    refusal is visible (at 400 px it lay over the top classes), and the note under the controls
    speaks of per-head maps only while they are shown."""
    (tmp_path / "notes.png").write_bytes(b"not an image\n" * 100)
    note = lambda page: page.inner_text("#controls-note").strip()  # noqa: E731
    for width in (400, 1400):
        with app_page(browser, shipped, width=width, height=900) as page:
            classify(page, PHOTO)
            click_patch(page, 3, 3, (7, 7))
            assert note(page).endswith("the per-head maps are below."), note(page)
            assert "not an image" in error_toast(page, tmp_path / "notes.png")
            page.wait_for_function("!document.querySelector('#overlay img')")
            assert note(page) == "Layer and head choose the attention shown.", note(page)  # nothing is below
            classify(page, PHOTO)
            visible = page.locator(TOASTS).evaluate_all("ts => ts.filter(t => t.offsetParent).length")
            assert visible == 0, (width, page.locator(TOASTS).all_inner_texts())
            assert note(page).endswith("the per-head maps are below.") and len(gallery_images(page)) == 4


def test_other_classes_get_their_own_examples(browser, other):
    with app_page(browser, other, width=800) as page:
        page.locator("button.gallery-item").first.wait_for(timeout=TIMEOUT_MS)  # drawn after the upload input
        assert page.locator("button.gallery-item").count() == 6  # the folder's images, not Fashion-MNIST's
        assert "Fashion-MNIST" not in page.inner_text("body")
        joins = count_queue_joins(page)
        click_example(page, 0)
        settle(page, joins, 1)
        assert set(top_classes(page)) <= set(OTHER_CLASSES)
        page.get_by_role("tab", name="What the model learned").click()
        assert "over 6 example images from the folder" in page.inner_text("body")


def test_a_patch_sequence_checkpoint_serves_a_wide_and_a_tall_upload_at_their_own_grids(browser, naflex, tmp_path):
    from apps.images import overlay_shape
    from keras_vit.naflex import budget_grid

    url, patch = naflex
    rng = np.random.default_rng(3)
    for name, (height, width) in (("wide", (40, 150)), ("tall", (150, 40))):
        path = tmp_path / f"{name}.png"
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype="uint8")).save(path)
        h, w = budget_grid(height, width, patch, NAFLEX_BUDGET)
        assert h * w <= NAFLEX_BUDGET and (w > 2 * h if name == "wide" else h > 2 * w), (h, w)
        with app_page(browser, url, width=1400) as page:
            assert set(classify(page, path)) <= set(OTHER_CLASSES)
            assert "each upload at its own aspect ratio" in page.inner_text("#facts")
            # The overlay is the image as the model saw it: its own grid, at its own aspect ratio.
            assert overlay_pixels(page).shape[:2] == overlay_shape((h * patch, w * patch), OVERLAY_SIZE)
            click_patch(page, h - 1, w - 1, (h, w))  # the last patch of this image's grid
            assert caption(page).startswith(f"Where the outlined patch (row {h}, column {w}) looks"), caption(page)
            rows, cols = overlay_pixels(page).shape[:2]
            top_edge = round((h - 1) * rows / h), round((w - 0.5) * cols / w)
            assert tuple(overlay_pixels(page)[top_edge]) == OUTLINE_COLOR
