"""The page's functions called directly, as Gradio calls them: clamped controls, the class and patch
events, the controls each view enables, the API's errors, and a page with no examples."""

import dataclasses
import re

import gradio as gr
import pytest
from gradio.data_classes import ImageData
from PIL import Image

from apps.page import ClampedSlider, IntegerInput, clamp
from apps.sources import Examples, fashion_mnist_examples
from apps.ui import NO_EXAMPLES, TITLE, build_demo
from tests.app.test_app_helpers import NAMES, noise, save, tiny_classifier


@pytest.fixture(scope="module")
def demo():
    return build_demo(tiny_classifier(1, pooling="gap"), NAMES, examples=Examples(fashion_mnist_examples()[:2], "x"))


def fn(demo, name):
    """The function behind the page event whose function is called `name`, or the API's."""
    found = [f.fn for f in demo.fns.values() if f.fn is not None and
             (f.api_name if name == "predict" else getattr(f.fn, "__name__", type(f.fn).__name__)) == name]
    return found[0]


def component(demo, elem_id):
    (found,) = [b for b in demo.blocks.values() if getattr(b, "elem_id", None) == elem_id]
    return found


def page_of(demo):
    """The `apps.ui.Page` whose components the events read and write."""
    return fn(demo, "_Show").page


def event(demo, name, image, values, *data):
    """Runs the page event `name` on `image` and `values` (by `apps.events.CONTROLS` name), with
    event data `data`; returns its outputs by the name of their `Page` field."""
    page = page_of(demo)
    result = fn(demo, name)({getattr(page, k): v for k, v in {"image": image, **values}.items()}, *data)
    names = {id(getattr(page, f.name)): f.name for f in dataclasses.fields(page) if f.name != "api"}
    return {names[id(component)]: value for component, value in result.items()}


def test_clamp_rounds_and_refuses_non_numbers():
    assert [clamp(v, 1, 6, 1) for v in (9, 0, 2.5, 3.49, -1e9, "4")] == [6, 1, 3, 3, 1, 4]
    assert all(isinstance(clamp(v, 1, 6, 1), int) for v in (2.5, 9))
    assert [clamp(v, 0.0, 1.0, 0.05) for v in (2, -1, 0.33, 0.5)] == [1.0, 0.0, 0.35, 0.5]
    assert [clamp(v, 1, 6, 1) for v in (None, "abc", "", float("nan"), float("inf"))] == [None] * 5
    slider = ClampedSlider(1, 6, step=1)
    assert slider.preprocess(9) == 9 and slider.clamp(slider.preprocess(9)) == 6  # compared as typed, then clamped
    assert slider.preprocess("abc") is None and slider.clamp(None) is None
    assert IntegerInput().api_info() == {"type": "integer"}


def test_page_events_set_the_view_class_patch_and_controls(demo, tmp_path):
    path = save(Image.fromarray(noise()), tmp_path / "x.png")
    typed = dict(layer=component(demo, "layer").preprocess(9), opacity=component(demo, "opacity").preprocess(2))
    values = dict(view="patch attention", class_name="class C", patch=None, head="2", fashion=True) | typed
    values = {k: values[k] for k in "view class_name patch layer head opacity fashion".split()}
    first = event(demo, "new_image", path, values)
    assert first["class_name"] == next(iter(first["top"]))  # a new image shows its top class
    # A control left as the page sent it gets no new value (a key pressed meanwhile stays); the others do.
    assert first["view"] == gr.update() and first["patch"] == (5, 5)  # the view as sent; the center patch
    assert first["layer"]["value"] == 2 and first["opacity"] == 1.0  # clamped into 1..2 and 0..1
    assert first["layer"]["interactive"] and first["head"]["interactive"] and first["per_head"]["visible"]
    assert first["per_head"]["label"] == "Per-head maps of layer 2" and len(first["per_head"]["value"]) == 3
    second = list(first["top"])[1]
    clicked = event(demo, "class_clicked", path, values, gr.SelectData(None, {"index": 1, "value": second}))
    assert clicked["view"] == "class relevance" and clicked["class_name"] == second
    assert clicked["caption"].startswith(f"<p>Why {second} (") and not clicked["layer"]["interactive"]
    assert not clicked["per_head"]["visible"] and "Layer and head are off" in clicked["controls_note"]
    patch = event(demo, "patch_clicked", path, values, gr.SelectData(None, {"index": [383, 0], "value": None}))
    assert patch["view"] == "patch attention" and patch["patch"] == (1, 8)
    assert "(row 1, column 8)" in patch["caption"]
    chosen = event(demo, "class_chosen", path, values, gr.SelectData(None, {"index": 9, "value": "class J"}))
    assert chosen["view"] == "class relevance" and chosen["class_name"] == "class J"
    ignored = event(demo, "_Show", path, dict(values, layer=None, opacity=None))
    assert ignored["layer"]["value"] == 2 and ignored["opacity"] == 0.5  # a non-number keeps the default
    kept = event(demo, "_Show", path, dict(values, layer=1, opacity=0.25, class_name="class J"))
    assert kept["layer"] == gr.update(interactive=True) and kept["opacity"] == gr.update() == kept["class_name"]
    empty = event(demo, "new_image", None, values)
    assert empty["top"] is None and empty["overlay"] is None and empty["per_head"]["value"] == []


def test_api_errors_name_the_bad_value_and_log_one_line(demo, tmp_path, capfd):
    path = save(Image.fromarray(noise()), tmp_path / "x.png")
    api = fn(demo, "predict")
    good = dict(view="class relevance", class_name="", patch_row=0, patch_column=0, layer=2, head="mean",
                opacity=0.5, fashion_style=True)
    top, overlay, caption, per_head, facts, unlike = api(path, *good.values())
    assert len(top) == 5 and overlay.endswith("overlay.png") and caption.startswith("<p>Why ") and per_head == []
    assert unlike == ""  # no out-of-domain statistics
    bad = [
        (dict(layer=12), "layer=12 is out of range; this model has layers 1 to 2"),
        (dict(layer=1.5), "layer=1.5 is not an integer"),
        (dict(head="5"), "head='5'; use 'mean' or '1' to '3'"),
        (dict(opacity=2), "opacity=2 is out of range"),
        (dict(view="gradcam"), "view='gradcam'; choose one of"),
        (dict(class_name="cat"), r"class 'cat' is not one of this model's 10 classes \(class A, class B, "
                                 r'class C, class D, class E, \.\.\.\)"?$'),
        (dict(patch_row=9, patch_column=1), r"patch \(row 9, column 1\) is outside the patch grid: rows 1 to 8"),
        (dict(patch_row=1), r"patch \(row 1, column 0\) is outside the patch grid"),
        (dict(opacity="abc"), "opacity='abc' is not a number; give opacity as a JSON number"),
        (dict(opacity="0.5"), "opacity='0.5' is not a number"),
        (dict(layer="3"), "layer='3' is not a number"),
        (dict(layer="abc"), "layer='abc' is not a number"),
        (dict(patch_row=[1]), r"patch_row=\[1\] is not a number"),
    ]
    # A value of the wrong type for each parameter (the image's is Gradio's, test_app_server.py).
    wrong_types = [
        (dict(view=3), "view=3 is not a string; give view as a JSON string"),
        (dict(class_name=["class A"]), r"class_name=\['class A'\] is not a string"),
        (dict(patch_row="1"), "patch_row='1' is not a number; give patch_row as a JSON number"),
        (dict(patch_column=True), "patch_column=True is not a number"),
        (dict(layer=[2]), r"layer=\[2\] is not a number"),
        (dict(head=1), "head=1 is not a string; give head as a JSON string"),
        (dict(opacity=None, layer={}), r"layer=\{\} is not a number"),
        (dict(fashion_style="false"), "fashion_style='false' is not a boolean; give fashion_style as JSON true or "
                                      "false"),
        (dict(fashion_style="no"), "fashion_style='no' is not a boolean"),
        (dict(fashion_style=0), "fashion_style=0 is not a boolean"),
        (dict(fashion_style=None), "fashion_style=None is not a boolean"),
    ]
    for change, message in bad + wrong_types:
        capfd.readouterr()
        with pytest.raises(gr.Error, match=message) as error:
            api(path, *dict(good, **change).values())
        assert not error.value.print_exception  # no server traceback for a client's bad value
        log = capfd.readouterr().err.splitlines()  # docs/app.md: one line on the server, naming the value
        assert len(log) == 1 and log[0].startswith(f"{TITLE}: refused a value: ") and error.value.message in log[0]
    assert api(path, *dict(good, fashion_style=False).values())[0] is not None
    (tmp_path / "notes.png").write_bytes(b"not an image")
    with pytest.raises(gr.Error, match="image refused. This file is not an image"):
        api(str(tmp_path / "notes.png"), *good.values())


def test_api_inputs_are_typed_and_outputs_named(demo):
    info = demo.get_api_info()["named_endpoints"]["/predict"]
    params = {p["parameter_name"]: p for p in info["parameters"]}
    assert list(params) == ["image", "view", "class_name", "patch_row", "patch_column", "layer", "head", "opacity",
                            "fashion_style"]
    assert params["layer"]["type"]["type"] == "integer" and params["patch_row"]["type"]["type"] == "integer"
    assert [r["label"] for r in info["returns"]] == ["Top 5 classes", "Overlay (the image as the model saw it)",
                                                     "Caption", "Per-head maps of the chosen layer", "Model facts",
                                                     "Out-of-domain warning"]
    assert list(demo.get_api_info()["named_endpoints"]) == ["/predict"]  # the page's events are private


def test_a_model_without_examples_says_so():
    demo = build_demo(tiny_classifier(3), NAMES)
    texts = [b.value for b in demo.blocks.values() if isinstance(b, gr.Markdown)]
    assert NO_EXAMPLES in texts and not [b for b in demo.blocks.values() if isinstance(b, gr.Dataset)]
    assert any("Attention distance** needs images" in t for t in texts)
    assert len([b for b in demo.blocks.values() if isinstance(b, gr.Plot)]) == 1  # position embeddings only


def test_a_model_of_three_classes_shows_its_top_three(tmp_path):
    from tests.conftest import randomize, tiny_vit

    model = randomize(tiny_vit(num_classes=3, class_names=NAMES[:3]), scale=0.1)
    demo = build_demo(model, NAMES[:3])
    assert component(demo, "top").label == "Top 3 classes"
    path = save(Image.fromarray(noise()), tmp_path / "x.png")
    with pytest.raises(gr.Error, match=r'is not one of this model.s 3 classes \(class A, class B, class C\)"?$'):
        fn(demo, "predict")(path, "class relevance", "cat", 0, 0, 1, "mean", 0.5, False)
    assert any("the model's top 3 classes, why" in b.value for b in demo.blocks.values() if isinstance(b, gr.Markdown))


def test_statistics_whose_check_is_off_flag_nothing_and_the_page_says_why(tmp_path):
    import dataclasses

    import numpy as np

    from apps.inference import Predictor
    from tests.conftest import randomize, tiny_vit
    from keras_vit import ood

    model = randomize(tiny_vit(num_classes=3, class_names=NAMES[:3]), scale=0.1)
    pixels = np.random.default_rng(1).integers(0, 256, (13, 32, 32, 3)).astype("uint8")
    off = "The out-of-domain check is off: too few images."
    stats = dataclasses.replace(ood.fit(model, pixels[:12], np.arange(12) % 3), off=off)
    assert component(build_demo(model, NAMES[:3], ood=stats), "ood-off").value == off
    assert not any(b.elem_id == "ood-off" for b in build_demo(model, NAMES[:3]).blocks.values())
    predictor = Predictor(model, NAMES[:3], stats)
    assert predictor.ood is None and predictor.ood_off == off
    path = tmp_path / "x.png"
    Image.fromarray(pixels[12]).save(path)
    assert predictor.predict(str(path)).unlike == ""


def test_uploads_outside_the_cache_and_non_files_are_refused_without_a_traceback(demo, capfd):
    from apps.page import AnyPayload, UploadedImage
    from keras_vit.io.images import ImageRejected

    outside = UploadedImage(type="filepath").preprocess(AnyPayload(ImageData(path="/etc/passwd").model_dump()))
    number = UploadedImage(type="filepath").preprocess(AnyPayload(5))
    assert isinstance(outside, ImageRejected) and str(outside) == "Only uploaded files are accepted."
    assert str(number) == "image=5 is not an uploaded file; send one with gradio_client.handle_file(path)"
    for refused in (outside, number):  # the event refuses it as it refuses a bad file: one log line, no traceback
        capfd.readouterr()
        with pytest.raises(gr.Error, match=f"image refused. {re.escape(str(refused))}") as error:
            fn(demo, "predict")(refused, "class relevance", "", 0, 0, 2, "mean", 0.5, True)
        assert not error.value.print_exception and capfd.readouterr().err.count("refused an upload") == 1


def test_a_dynamic_model_page_clicks_and_api_follow_each_uploads_grid(tmp_path):
    page = build_demo(tiny_classifier(dynamic_image_size=True), NAMES)
    wide = save(Image.fromarray(noise((160, 40))), tmp_path / "wide.png")  # seen as 16 x 64: a 4 x 16 grid
    values = dict(view="patch attention", class_name=None, patch=None, layer=2, head="mean", opacity=0.5, fashion=False)
    first = event(page, "new_image", wide, values)
    assert first["patch"] == (3, 9) and Image.open(first["overlay"]).size == (1536, 384)
    clicked = event(page, "patch_clicked", wide, values, gr.SelectData(None, {"index": [1535, 0], "value": None}))
    assert clicked["patch"] == (1, 16) and "(row 1, column 16)" in clicked["caption"]
    api = fn(page, "predict")
    api(str(wide), "patch attention", "", 1, 16, 2, "mean", 0.5, False)  # column 16 exists in this image's grid
    with pytest.raises(gr.Error, match=r"patch \(row 1, column 17\) is outside this image's patch grid"):
        api(str(wide), "patch attention", "", 1, 17, 2, "mean", 0.5, False)


def test_a_patch_sequence_model_page_clicks_and_api_follow_each_uploads_grid(tmp_path):
    page = build_demo(tiny_classifier(max_seq_len=20), NAMES)
    tall = save(Image.fromarray(noise((40, 160))), tmp_path / "tall.png")  # 8 x 2 patches within 20 tokens
    values = dict(view="patch attention", class_name=None, patch=None, layer=2, head="mean", opacity=0.5, fashion=False)
    first = event(page, "new_image", tall, values)
    assert first["patch"] == (5, 2) and Image.open(first["overlay"]).size == (96, 384)
    clicked = event(page, "patch_clicked", tall, values, gr.SelectData(None, {"index": [95, 383], "value": None}))
    assert clicked["patch"] == (8, 2) and "(row 8, column 2)" in clicked["caption"]
    api = fn(page, "predict")
    api(str(tall), "patch attention", "", 8, 2, 2, "mean", 0.5, False)
    with pytest.raises(gr.Error, match=r"patch \(row 9, column 1\) is outside this image's patch grid"):
        api(str(tall), "patch attention", "", 9, 1, 2, "mean", 0.5, False)
    facts = component(page, "facts").value
    assert "at most 20 patches, each upload at its own aspect ratio" in facts


def test_the_settings_are_checked_once_per_page_event_and_api_call(demo, tmp_path, monkeypatch):
    path = save(Image.fromarray(noise()), tmp_path / "x.png")
    show = fn(demo, "_Show")
    checked, real = [], show.predictor.check
    monkeypatch.setattr(show.predictor, "check", lambda settings: checked.append(settings) or real(settings))
    values = dict(view="class relevance", class_name="class C", patch=None, layer=1, head="mean", opacity=0.5,
                  fashion=False)
    assert event(demo, "_Show", path, values)["top"] is not None and len(checked) == 1
    api = fn(demo, "predict")
    assert api(path, "class relevance", "", 0, 0, 1, "mean", 0.5, False)[0] is not None and len(checked) == 2
