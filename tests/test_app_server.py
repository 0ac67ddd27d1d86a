"""The demo served over HTTP: the documented /predict API (gradio_client), hostile uploads through the
server, and a load test. Each test module launches its own server on a free localhost port."""

import concurrent.futures
import time

import httpx
import numpy as np
import pytest
from gradio_client import Client, handle_file
from PIL import Image

from apps.demo import example_images, launch
from apps.ui import UploadedImage, build_demo
from test_app_helpers import NAMES, free_port, noise, png_header_only, save, tiny_classifier, truncated_png


@pytest.fixture(scope="module")
def server():
    demo = build_demo(tiny_classifier(1), NAMES, examples=example_images()[:4])
    _, url, _ = launch(demo, port=free_port(), prevent_thread_lock=True, quiet=True)
    yield url
    demo.close()


def call(client, path, **kwargs):
    args = dict(view="rollout", layer=1, head="mean", opacity=0.5, fashion=True) | kwargs
    return client.predict(handle_file(str(path)), *args.values(), api_name="/predict")


def test_api_predict(server, tmp_path):
    client = Client(server, verbose=False)
    assert "/predict" in client.view_api(return_format="dict")["named_endpoints"]
    top, overlay, gallery, facts = call(client, example_images()[0])
    assert [c["label"] for c in top["confidences"]][:1] == [top["label"]] and len(top["confidences"]) == 5
    assert np.asarray(Image.open(overlay)).shape == (384, 384, 3)
    assert len(gallery) == 3 and gallery[2]["caption"] == "layer 1 head 3"  # layers and heads from 1
    assert "latency of this result" in facts and " ms</td>" in facts and "not rerun" not in facts
    assert facts.startswith('<table class="facts"><caption>Model facts</caption><tr><th>preset</th>')  # no empty header
    # Another map of the same upload redraws it without running the model again.
    again = client.predict(handle_file(str(example_images()[0])), "class-token attention", 2, "1", 0.5, True,
                           api_name="/predict")
    assert again[2][0]["caption"] == "layer 2 head 1" and again[0] == top


def test_hostile_uploads_get_a_message_and_the_server_stays_up(server, tmp_path, capfd):


    client = Client(server, verbose=False)
    hostile = {
        "empty.png": b"",
        "notes.png": b"not an image\n" * 100,
        "bomb.png": png_header_only(20000, 20000),
    }
    for name, content in hostile.items():
        (tmp_path / name).write_bytes(content)
    paths = [tmp_path / n for n in hostile] + [truncated_png(tmp_path / "cut.png")]
    messages = ["not an image", "not an image", "decompression-bomb limit", "damaged or truncated"]
    for path, message in zip(paths, messages):
        capfd.readouterr()
        top, overlay, gallery, facts = call(client, path)  # a warning toast, not an error: panes cleared
        assert not top and (overlay, gallery) == (None, []) and "latency of this result</th><td>-<" in facts
        log = capfd.readouterr().err
        assert log.count("refused an upload") == 1 and message in log and "Traceback" not in log
        assert len(call(client, example_images()[1])[0]["confidences"]) == 5  # the next request works
    (tmp_path / "huge.png").write_bytes(b"\0" * 30_000_000)  # over the 25 MiB max_file_size
    with pytest.raises(Exception, match="exceeds the maximum file size of 26214400 bytes"):
        call(client, tmp_path / "huge.png")  # the client checks first, as the browser does
    with open(tmp_path / "huge.png", "rb") as f:  # the server checks too
        reply = httpx.post(f"{server}gradio_api/upload", files={"files": ("huge.png", f)}, timeout=60)
    assert reply.status_code == 413 and "maximum allowed size" in reply.text
    for size in [(1, 1), (10000, 10)]:
        assert len(call(client, save(Image.new("L", size, 128), tmp_path / "s.png"))[0]["confidences"]) == 5


def test_uploads_outside_the_cache_are_refused():
    from gradio.data_classes import ImageData
    from gradio.exceptions import Error

    with pytest.raises(Error, match="Only uploaded files"):
        UploadedImage(type="filepath").preprocess(ImageData(path="/etc/passwd"))


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
                _, overlay, gallery, _ = call(client, paths[0] if i % 2 else paths[(i + j) % 4])
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
