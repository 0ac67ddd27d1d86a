"""`python -m apps.demo` (or `keras-vit-demo`): serves a keras_vit checkpoint in a Gradio app.

    python -m apps.demo                                  # the shipped Fashion-MNIST model
    python -m apps.demo --checkpoint ViT-B_16.npz        # an official checkpoint, ImageNet names
    python -m apps.demo --checkpoint hf://timm/vit_base_patch16_224.augreg2_in21k_ft_in1k   # from the Hub
    python -m apps.demo --checkpoint model.keras --labels labels.txt --port 8080

It listens on 127.0.0.1 unless --host says otherwise, and makes no public link unless --share.
"""

import argparse
import sys
from pathlib import Path

from apps import DEFAULT_CHECKPOINT
from training import malloc

# gradio, Pillow and Keras are imported inside the functions: `main` restarts the process with the
# chosen allocator first, and a restart after those imports would load them twice.

ASSETS = Path(__file__).resolve().parent / "assets"
MAX_FILE_SIZE = "25mb"
CONCURRENCY = 2  # the forward pass holds a lock; two workers keep decoding and drawing busy
QUEUE_SIZE = 64
CSS = ".gradio-container {max-width: 1200px !important}"


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="keras-vit-demo", description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", default=str(DEFAULT_CHECKPOINT), help="a .keras, .npz, timm .safetensors or HF folder; a handle (hf://org/repo, gs://..., https://...) or a name of keras_vit.list_pretrained()")
    p.add_argument("--labels", default=None, help="a text file with one class name per line")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--share", action="store_true", help="also open a public gradio.live link")
    malloc.add_argument(p)
    return p.parse_args(argv)


def example_images():
    """The shipped examples (`python -m apps.make_examples` writes them): Fashion-MNIST test images
    and two photo-style images; they are converted to the model's channels like any upload."""
    return sorted(ASSETS.glob("*.png"))


def launch(demo, host="127.0.0.1", port=7860, share=False, **kwargs):
    """Starts `demo` with the app's limits: a bounded queue, a per-event concurrency limit and a
    file-size cap. Returns what `gr.Blocks.launch` returns."""
    import gradio as gr

    demo.queue(max_size=QUEUE_SIZE, default_concurrency_limit=CONCURRENCY)
    return demo.launch(
        server_name=host,
        server_port=port,
        share=share,
        max_file_size=MAX_FILE_SIZE,
        footer_links=["api", "gradio", "settings"],
        theme=gr.themes.Soft(),
        css=CSS,
        allowed_paths=[str(ASSETS)],
        **kwargs,
    )


def main(argv=None):
    args = parse_args(argv)
    if argv is None:  # the real command line: restart it with the allocator before gradio and Keras load
        malloc.reexec(args.malloc)
    from PIL import Image

    from apps.checkpoint import class_labels, load_model
    from apps.images import MAX_PIXELS
    from apps.ui import build_demo

    # Pillow's own bomb guard, for any decoding outside apps.images: it warns above this and
    # refuses above twice this.
    Image.MAX_IMAGE_PIXELS = MAX_PIXELS
    try:
        model = load_model(args.checkpoint)
        labels = class_labels(model, args.labels)
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        sys.exit(f"keras-vit-demo: {e}")
    demo = build_demo(model, labels, examples=example_images())
    launch(demo, args.host, args.port, args.share)


if __name__ == "__main__":
    main()
