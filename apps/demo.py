"""`python -m apps.demo`, from a checkout of the repository: serves a keras_vit checkpoint in a Gradio app.

    python -m apps.demo                                  # the shipped Fashion-MNIST model
    python -m apps.demo --checkpoint ViT-B_16.npz        # an official checkpoint, ImageNet names
    python -m apps.demo --checkpoint hf://timm/vit_base_patch16_224.augreg2_in21k_ft_in1k   # from the Hub
    python -m apps.demo --checkpoint model.keras --labels labels.txt --port 8080
    python -m apps.demo --checkpoint runs/pets/model.keras --examples photos/   # examples to click on

It listens on 127.0.0.1 unless --host says otherwise, and makes no public link unless --share.
"""

import importlib.util
import os
import socket
from pathlib import Path

from apps import DEFAULT_CHECKPOINT
from apps.sources import ASSETS, SOURCES, check_folder, check_source, find_examples
from commands import cli, malloc

# gradio, Pillow and Keras are imported inside the functions: `main` restarts the process with the
# chosen allocator first, and a restart after those imports would load them twice. The backend and
# the log settings must also be in the environment before Keras loads.

MAX_FILE_SIZE = "25mb"
CONCURRENCY = 2  # the forward pass holds a lock; two workers keep decoding and drawing busy
QUEUE_SIZE = 64
# The first installed one is used unless KERAS_BACKEND is set; the demo install has JAX only
# (docs/testing.md: install sizes and speeds).
BACKENDS = ("jax", "tensorflow", "torch")
PROG = "python -m apps.demo"


def parse_args(argv=None):
    p = cli.parser(PROG, __doc__)
    p.add_argument("--checkpoint", default=str(DEFAULT_CHECKPOINT),
                   help=SOURCES)
    p.add_argument("--labels", default=None, help="a text file with one class name per line (default: the "
                   "checkpoint's class names, ImageNet's for 1000 classes, else 'class i')")
    p.add_argument("--examples", default=None, help="a folder of example images, or of class sub-folders "
                   "(default: the examples/ folder beside the checkpoint, which training writes; else the "
                   "Fashion-MNIST test images for a Fashion-MNIST model; else none)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=7860, help="port to listen on")
    p.add_argument("--share", action="store_true", help="also open a public gradio.live link")
    p.add_argument("--verbose", action="store_true", help="show the libraries' logs (TensorFlow, XLA, Gradio)")
    malloc.add_argument(p)
    return p.parse_args(argv)


def choose_backend(environ=os.environ):
    """KERAS_BACKEND if set, else the first installed of `BACKENDS`, which is then set in `environ`
    so that Keras loads it."""
    if environ.get("KERAS_BACKEND"):
        return environ["KERAS_BACKEND"]
    installed = [b for b in BACKENDS if importlib.util.find_spec(b) is not None]
    if not installed:
        raise ValueError(f"no Keras backend is installed; pip install one of {', '.join(BACKENDS)}")
    environ["KERAS_BACKEND"] = installed[0]
    return installed[0]


def check_args(args):
    """Refuses a missing or malformed checkpoint, labels file or examples folder, and a port that is
    taken, in well under a second, before any deep-learning library loads."""
    check_port(args.host, args.port)
    check_source(args.checkpoint)
    if args.labels is not None and not Path(args.labels).is_file():
        raise FileNotFoundError(f"--labels {args.labels}: no such file")
    if args.examples is not None:
        check_folder(args.examples)


def check_port(host, port):
    """Raises ValueError, naming --port, when `host`:`port` cannot be listened on (another demo holds
    it), so that the refusal comes before the model loads. The server binds it again later; a port
    taken in between is refused by `launch` in the same words."""
    if not 1 <= port <= 65535:
        raise ValueError(f"--port {port} is not a port; use 1-65535")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as error:
        raise ValueError(f"--host {host}: {error.strerror}; give an address such as 127.0.0.1 or 0.0.0.0") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is free
        try:
            probe.bind(address)
        except OSError as error:
            raise ValueError(port_taken(host, port, error)) from None


def port_taken(host, port, error):
    return (f"--port {port}: {host}:{port} cannot be listened on ({error.strerror or error}; another demo may be "
            f"running there); stop it or pass another --port, such as --port {port + 1 if port < 65535 else 7860}")


def launch(demo, host="127.0.0.1", port=7860, share=False, **kwargs):
    """Starts `demo` with the app's limits: a bounded queue, a concurrency limit and a file-size
    cap. Returns what `gr.Blocks.launch` returns."""
    import gradio as gr

    from apps.page import CSS_PATHS, HEAD

    demo.queue(max_size=QUEUE_SIZE, default_concurrency_limit=CONCURRENCY)
    return demo.launch(
        server_name=host,
        server_port=port,
        share=share,
        max_file_size=MAX_FILE_SIZE,
        footer_links=["api", "gradio", "settings"],
        theme=gr.themes.Soft(),
        css_paths=CSS_PATHS,
        head=HEAD,
        allowed_paths=[str(ASSETS)],
        **kwargs,
    )


def startup_line(checkpoint, model, labels, url, share_url=None):
    """The one line the demo prints when it is ready."""
    import keras

    h, w = model.image_size
    names = ", ".join(labels[:5]) + (", ..." if len(labels) > 5 else "")
    share = f" and {share_url}" if share_url else ""
    size = (f"{h} x {w} px" if model.max_seq_len is None else
            f"patch sequences of at most {model.max_seq_len} patches of {model.patch_size} px")
    return (f"{PROG}: serving {checkpoint} on {keras.backend.backend()}: {len(labels)} classes "
            f"({names}), {size}, {model.num_channels} channel(s); open {url}{share}")


def main(argv=None):
    args = parse_args(argv)
    if argv is None:  # the real command line: restart it with the allocator before gradio and Keras load
        malloc.reexec(args.malloc, quiet=not args.verbose)
    cli.quiet_logs(args.verbose)
    with cli.one_line_errors(PROG, cli.USER_ERRORS + (RuntimeError,)):
        check_args(args)
        if choose_backend() == "tensorflow":
            cli.import_tensorflow(args.verbose)
        demo, model, labels = _build(args)
    try:
        _, url, share_url = launch(demo, args.host, args.port, args.share, quiet=not args.verbose,
                                   prevent_thread_lock=True)
    except OSError as error:  # taken since check_port: Gradio's words name its own setting, not --port
        if "port" not in str(error):
            raise
        with cli.one_line_errors(PROG):
            raise ValueError(port_taken(args.host, args.port, error)) from None
    print(startup_line(args.checkpoint, model, labels, url, share_url), flush=True)
    demo.block_thread()


def _build(args):
    from PIL import Image

    import keras_vit
    from apps.sources import class_labels, ood_stats
    from keras_vit.io.images import MAX_PIXELS
    from apps.ui import build_demo

    # Pillow's own bomb guard, for any decoding outside keras_vit.io.images: it warns above this and
    # refuses above twice this.
    Image.MAX_IMAGE_PIXELS = MAX_PIXELS
    model = keras_vit.load(args.checkpoint)  # checked by check_args before Keras loaded
    labels = class_labels(model, args.labels)
    examples = find_examples(args.checkpoint, labels, args.examples)
    return build_demo(model, labels, examples, ood_stats(args.checkpoint, model)), model, labels


if __name__ == "__main__":
    main()
