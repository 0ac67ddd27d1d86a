"""The demo served over HTTP: the documented /predict API through gradio_client (the docs' snippets
run as written against the shipped model), hostile uploads through the server, and a load test. The
module launches one server on a free localhost port."""

import concurrent.futures
import contextlib
import re
import time

import httpx
import numpy as np
import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError
from PIL import Image

import keras_vit
from apps.sources import DEFAULT_CHECKPOINT, class_labels, ood_stats
from apps.demo import launch
from apps.sources import Examples, fashion_mnist_examples
from apps.ui import TITLE, build_demo
from tests import ROOT
from tests.app.test_app_helpers import free_port, noise, png_header_only, save, truncated_png

EXAMPLE = fashion_mnist_examples()[-1]  # a photo-style T-shirt


@pytest.fixture(scope="module")
def server():
    model = keras_vit.load(DEFAULT_CHECKPOINT)
    demo = build_demo(model, class_labels(model), Examples(fashion_mnist_examples()[:4], "test"),
                      ood_stats(DEFAULT_CHECKPOINT, model))
    _, url, _ = launch(demo, port=free_port(), prevent_thread_lock=True, quiet=True)
    yield url
    demo.close()


@pytest.fixture(scope="module")
def client(server):
    return Client(server, verbose=False)


def call(client, path, **kwargs):
    return client.predict(handle_file(str(path)), **kwargs, api_name="/predict")


def test_api_class_relevance_patch_attention_and_named_outputs(client):
    api = client.view_api(return_format="dict")["named_endpoints"]
    assert list(api) == ["/predict"]
    assert [r["label"] for r in api["/predict"]["returns"]][:3] == [
        "Top 5 classes", "Overlay (the image as the model saw it)", "Caption"]
    assert {p["parameter_name"]: p["python_type"]["type"] for p in api["/predict"]["parameters"]}["layer"] == "int"
    top, overlay, caption, per_head, facts, unlike = call(client, EXAMPLE)
    names = [c["label"] for c in top["confidences"]]
    assert unlike == ""  # a garment: in domain
    assert len(names) == 5 and names[0] == top["label"] == "T-shirt/top"
    assert caption.startswith("<p>Why T-shirt/top (") and per_head == []
    assert np.asarray(Image.open(overlay)).shape == (384, 384, 3)
    assert "latency of this result" in facts and " ms</td>" in facts
    second = call(client, EXAMPLE, class_name=names[1])
    assert second[2].startswith(f"<p>Why {names[1]} (") and "not rerun" in second[4]  # kept from the upload
    assert not np.array_equal(np.asarray(Image.open(overlay)), np.asarray(Image.open(second[1])))
    _, patch, caption, per_head, _, _ = call(client, EXAMPLE, view="patch attention", patch_row=2, patch_column=3,
                                             layer=6, head="1")
    assert "(row 2, column 3)" in caption and "layer 6, head 1" in caption
    assert [tile["caption"] for tile in per_head] == ["head 1", "head 2", "head 3", "head 4"]


def test_an_image_unlike_the_training_data_gets_a_warning(client, tmp_path):
    import skimage.data

    astronaut = save(Image.fromarray(skimage.data.astronaut()), tmp_path / "astronaut.png")
    top, _, _, _, _, unlike = call(client, astronaut)
    # In plain words through the API too: a percentile of held-out training images, no raw score.
    assert "This image is less like the training images than" in unlike and "so these classes are guesses" in unlike
    assert "score" not in unlike and "threshold" not in unlike
    assert len(top["confidences"]) == 5  # still classified


def test_the_docs_snippets_run_against_the_shipped_model(server, capfd):
    text = (ROOT / "docs" / "app.md").read_text()
    snippets = [s for s in re.findall(r"```python\n(.*?)```", text, re.S) if "gradio_client" in s]
    assert len(snippets) == 2
    for snippet in snippets:
        capfd.readouterr()
        with contextlib.chdir(ROOT):
            exec(snippet.replace("http://127.0.0.1:7860/", server), {})  # noqa: S102 -- the docs' own code
        out, err = capfd.readouterr()
        assert "Traceback" not in err, err
    assert "image refused. This file is not an image" in out and "layer=12 is out of range" in out
    assert err.count(f"{TITLE}: refused a value: layer=12 is out of range") == 1, err  # as docs/app.md says


def test_api_values_of_the_wrong_type_are_refused_in_one_line(client, capfd):
    """Through the server, as a client's JSON sends them: a string for a boolean, a number for a string,
    a string for a number, and a number for the image."""
    cases = [(dict(fashion_style="false"), "fashion_style='false' is not a boolean"),
             (dict(view=2), "view=2 is not a string"), (dict(layer="6"), "layer='6' is not a number")]
    for change, message in cases:
        capfd.readouterr()
        with pytest.raises(AppError, match=message):
            call(client, EXAMPLE, **change)
        log = capfd.readouterr().err
        assert log.count("refused a value") == 1 and message in log and "Traceback" not in log, log
    capfd.readouterr()
    with pytest.raises(AppError, match="image=5 is not an uploaded file"):
        client.predict(5, api_name="/predict")
    log = capfd.readouterr().err
    assert log.count("refused") == 1 and "Traceback" not in log, log


def test_refused_uploads_raise_with_the_pages_message(client, tmp_path, capfd):
    hostile = {"empty.png": b"", "notes.png": b"not an image\n" * 100, "bomb.png": png_header_only(20000, 20000)}
    for name, content in hostile.items():
        (tmp_path / name).write_bytes(content)
    paths = [tmp_path / n for n in hostile] + [truncated_png(tmp_path / "cut.png")]
    messages = ["not an image", "not an image", "decompression-bomb limit", "damaged or truncated"]
    for path, message in zip(paths, messages):
        capfd.readouterr()
        with pytest.raises(AppError, match=f"{TITLE}: image refused. .*{message}"):
            call(client, path)
        log = capfd.readouterr().err
        assert log.count("refused an upload") == 1 and message in log and "Traceback" not in log
        assert len(call(client, EXAMPLE)[0]["confidences"]) == 5  # the next request works
    (tmp_path / "huge.png").write_bytes(b"\0" * 30_000_000)  # over the 25 MiB max_file_size
    with pytest.raises(Exception, match="exceeds the maximum file size of 26214400 bytes"):
        call(client, tmp_path / "huge.png")  # the client checks first, as the browser does
    with open(tmp_path / "huge.png", "rb") as f:  # the server checks too
        reply = httpx.post(f"{client.src}gradio_api/upload", files={"files": ("huge.png", f)}, timeout=60)
    assert reply.status_code == 413 and "maximum allowed size" in reply.text
    for size in [(1, 1), (10000, 10)]:
        assert len(call(client, save(Image.new("L", size, 128), tmp_path / "s.png"))[0]["confidences"]) == 5


@pytest.mark.slow
def test_load_8_clients_x_25_requests(server, tmp_path):
    # Half the clients send one identical image, so identical outputs are produced in parallel.
    paths = [save(Image.fromarray(noise(seed=s)), tmp_path / f"{s}.png") for s in range(4)]
    latencies, errors = [], []

    def client_run(i):
        client = Client(server, verbose=False)
        for j in range(25):
            start = time.perf_counter()
            try:
                _, overlay, _, gallery, _, _ = call(client, paths[0] if i % 2 else paths[(i + j) % 4],
                                                 view="mean patch attention")
                Image.open(overlay).load()  # a broken or short file fails here
                [Image.open(g["image"]).load() for g in gallery]
            except Exception as e:  # noqa: BLE001 -- every failure is counted and printed
                errors.append(repr(e))
            latencies.append(time.perf_counter() - start)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(client_run, range(8)))
    p50, p95 = np.percentile(latencies, [50, 95]) * 1000
    print(f"\nload test: {len(latencies)} requests, {len(errors)} errors, p50 {p50:.0f} ms, p95 {p95:.0f} ms")
    assert errors == []

