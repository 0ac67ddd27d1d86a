"""Identical outputs under concurrency (see `apps.page.publish`).

Gradio 6.31 saves returned arrays and PIL images with `processing_utils.save_pil_to_cache`, which
names the file by the hash of its bytes and rewrites it in place, so parallel requests with the same
output share one file while it is truncated and rewritten. The app returns each image as a fresh
file instead (`apps.ui.publish`).
"""

import concurrent.futures
import os

import gradio as gr
import numpy as np
import pytest
from gradio import processing_utils
from gradio_client import Client
from PIL import Image

from apps.page import publish
from apps.ui import build_demo
from tests.app.test_app_helpers import NAMES, free_port, noise, tiny_classifier


def test_upstream_cause_gradio_rewrites_cached_images_in_place(tmp_path):
    # If this fails, Gradio now replaces the file atomically (a new inode); `publish` could then go,
    # and this test with it.
    image = Image.fromarray(noise())
    first = processing_utils.save_pil_to_cache(image, str(tmp_path))
    inode, size = os.stat(first).st_ino, os.stat(first).st_size
    with open(first, "rb") as reader:  # a download in progress
        second = processing_utils.save_pil_to_cache(image, str(tmp_path))
        assert second == first and os.stat(second).st_ino == inode  # same file, rewritten in place
        assert len(reader.read()) == size


def test_publish_gives_each_response_its_own_file(tmp_path):
    a = noise()
    paths = [publish(a, tmp_path) for _ in range(2)]
    assert paths[0] != paths[1] and os.stat(paths[0]).st_ino != os.stat(paths[1]).st_ino
    assert all(np.array_equal(np.asarray(Image.open(p)), a) for p in paths)


def test_the_app_returns_paths_not_arrays(tmp_path):
    demo = build_demo(tiny_classifier(), NAMES)
    (fn,) = [f for f in demo.fns.values() if f.api_name == "predict"]
    path = tmp_path / "x.png"
    Image.fromarray(noise()).save(path)
    top, overlay, _, gallery, _, _ = fn.fn(str(path), "class-token attention", "", 0, 0, 1, "mean", 0.5, False)
    assert isinstance(overlay, str) and len(gallery) == 3 and all(isinstance(p, str) for p, _ in gallery)
    assert os.path.commonpath([overlay, demo.GRADIO_CACHE]) == demo.GRADIO_CACHE


def _hammer(url, expected, clients=8, requests=25):
    def run(_):
        client, errors = Client(url, verbose=False), 0
        for _ in range(requests):
            try:
                errors += not np.array_equal(np.asarray(Image.open(client.predict(api_name="/image"))), expected)
            except Exception:  # noqa: BLE001 -- a short read is the failure being counted
                errors += 1
        return errors

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        return sum(pool.map(run, range(clients)))


@pytest.mark.slow
@pytest.mark.parametrize("returns", ["array (stock)", "published path (app)"])
def test_identical_outputs_in_parallel(returns):
    expected = np.random.default_rng(0).integers(0, 256, (256, 256, 3), dtype="uint8")
    with gr.Blocks() as demo:
        out = gr.Image(format="png")
        fn = (lambda: expected) if returns.startswith("array") else (lambda: publish(expected, out.GRADIO_CACHE))
        gr.Button().click(fn, None, out, api_name="image")
    demo.queue(default_concurrency_limit=8)
    _, url, _ = demo.launch(server_port=free_port(), prevent_thread_lock=True, quiet=True)
    try:
        errors = _hammer(url, expected)
    finally:
        demo.close()
    print(f"\n{returns}: {errors} of 200 parallel identical responses were broken")
    if returns.startswith("published"):
        assert errors == 0
