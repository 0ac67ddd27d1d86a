"""Builders for the app tests: tiny served models and image files of every kind, hostile included."""

import io
import socket
import struct
import zlib

import numpy as np
from PIL import Image

from tests.conftest import randomize, tiny_vit

NAMES = [f"class {c}" for c in "ABCDEFGHIJ"]


def tiny_classifier(num_channels=3, **overrides):
    """A randomized tiny ViT with 10 named classes (the house-style tiny config)."""
    model = tiny_vit(num_classes=10, num_channels=num_channels, class_names=NAMES, **overrides)
    return randomize(model, scale=0.1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def garment(size=64, light_background=True):
    """An "L" image: a dark rectangle (the garment) on a light background, or the inverse."""
    a = np.full((size, size), 230, "uint8")
    a[size // 4 : 3 * size // 4, size // 3 : 2 * size // 3] = 30
    return Image.fromarray(a if light_background else 255 - a, "L")


def noise(mode_size=(48, 40), seed=0):
    return np.random.default_rng(seed).integers(0, 256, (mode_size[1], mode_size[0], 3), dtype="uint8")


def save(im, path, **kwargs):
    im.save(path, **kwargs)
    return path


def png_header_only(width, height):
    """A PNG whose header claims width x height RGB pixels but holds almost no data: a bomb's shape
    without its cost."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def truncated_png(path):
    buf = io.BytesIO()
    Image.fromarray(noise((64, 64))).save(buf, "PNG")
    path.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    return path


def test_the_static_files_break_to_one_column_at_the_same_width():
    """page.css and toasts.css each name the one-column width; both agree with NARROW."""
    import re

    from apps import page

    widths = [int(w) for name in ("page.css", "toasts.css")
              for w in re.findall(r"@media \(max-width: (\d+)px\)", (page.STATIC / name).read_text())]
    assert len(widths) == 2 and set(widths) == {page.NARROW}, widths
    assert (page.STATIC / "page.js").read_text() in page.HEAD
