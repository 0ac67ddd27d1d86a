"""Hardened image decoding, for the demo's uploads and the training folders alike: any image file
becomes a small RGB or L image, or an `ImageRejected` error whose message can be shown to a user
as is.

Limits (stated in the app's UI and in docs/app.md):
- files of more than `MAX_PIXELS` pixels are refused from their header, before any pixel is decoded.
  The cap is well below Pillow's own decompression-bomb error (2 x `Image.MAX_IMAGE_PIXELS`,
  about 179 MP), so a bomb never reaches the decoder;
- legal images are reduced to at most `MAX_SIDE` pixels on the long side. JPEGs are decoded at a
  reduced scale (`Image.draft`), so a 50 MP photo never exists in memory at full size.
"""

import warnings

import numpy as np
from PIL import Image, UnidentifiedImageError

MAX_PIXELS = 50_000_000
MAX_SIDE = 1024
# The background that transparent pixels are composited onto.
BACKGROUND = (255, 255, 255)


class ImageRejected(ValueError):
    """An image file that `open_image` refuses; the message is meant for the user who gave it."""


def open_image(source):
    """Opens a path, file object or PIL image and returns it as an "RGB" or "L" image whose long
    side is at most `MAX_SIDE`, upright (EXIF orientation applied). Raises `ImageRejected` for
    anything that is not a readable image within the limits."""
    if isinstance(source, Image.Image):
        return _decode(source)
    try:
        # Pillow warns from 1 x MAX_IMAGE_PIXELS; MAX_PIXELS, checked below from the header, is lower
        # and gives the one message, so its warning would only repeat that on stderr.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(source)
    except Image.DecompressionBombError as e:
        raise ImageRejected(
            f"This image is larger than Pillow's decompression-bomb limit; keras_vit accepts images "
            f"of up to {MAX_PIXELS / 1e6:.0f} MP."
        ) from e
    except UnidentifiedImageError as e:
        raise ImageRejected(
            "This file is not an image that Pillow can read (PNG, JPEG, GIF, WebP, BMP, TIFF, ...)."
        ) from e
    except Exception as e:  # noqa: BLE001 -- any decoder failure on untrusted bytes is a refusal
        raise ImageRejected(f"This file could not be read as an image ({e.__class__.__name__}).") from e
    with im:  # closes the file, which multi-frame formats would otherwise keep open
        return _decode(im)


def _decode(im):
    width, height = im.size
    if width * height > MAX_PIXELS:
        raise ImageRejected(
            f"This image is {width} x {height} = {width * height / 1e6:.0f} MP; "
            f"keras_vit accepts images of up to {MAX_PIXELS / 1e6:.0f} MP."
        )
    if width < 1 or height < 1:
        raise ImageRejected(f"This image has no pixels ({width} x {height}).")
    # For JPEG this picks a decoder scale of 1/2 .. 1/8, so huge photos decode small.
    im.draft("RGB" if im.mode not in ("L", "1") else "L", (MAX_SIDE, MAX_SIDE))
    try:
        im.load()
        orientation = im.getexif().get(0x0112, 1)  # read after load: PNG may keep EXIF after the pixels
    except Exception as e:  # noqa: BLE001 -- as above: truncated data, corrupt chunks, bad EXIF
        raise ImageRejected(f"This image file is damaged or truncated ({e}).") from e
    im = _canonical_mode(im)
    im.thumbnail((MAX_SIDE, MAX_SIDE), Image.Resampling.LANCZOS)
    return _orient(im, orientation)


def _orient(im, orientation):
    """Applies an EXIF orientation tag (1..8), read before `thumbnail`, which may drop it."""
    ops = {
        2: [Image.Transpose.FLIP_LEFT_RIGHT],
        3: [Image.Transpose.ROTATE_180],
        4: [Image.Transpose.FLIP_TOP_BOTTOM],
        5: [Image.Transpose.TRANSPOSE],
        6: [Image.Transpose.ROTATE_270],
        7: [Image.Transpose.TRANSVERSE],
        8: [Image.Transpose.ROTATE_90],
    }.get(orientation, [])
    for op in ops:
        im = im.transpose(op)
    return im


def _canonical_mode(im):
    """Any Pillow mode -> "RGB" or "L". Transparency is composited onto `BACKGROUND`; high bit
    depths are scaled into 0..255 rather than clipped (Pillow's own `convert` saturates them)."""
    if im.mode in ("RGB", "L"):
        return im
    if im.mode == "1":
        return im.convert("L")
    if im.mode.startswith("I;16") or im.mode in ("I", "F"):
        return Image.fromarray(_to_uint8(np.asarray(im), im.mode), "L")
    if im.mode == "P":
        im = im.convert("RGBA" if "transparency" in im.info else "RGB")
    elif im.mode in ("LA", "La", "PA"):
        im = im.convert("RGBA")
    elif im.mode in ("RGBa", "RGBX"):
        im = im.convert("RGBA")
    if im.mode == "RGBA":
        canvas = Image.new("RGB", im.size, BACKGROUND)
        canvas.paste(im, mask=im.getchannel("A"))
        return canvas
    if im.mode == "RGB":
        return im
    try:  # CMYK, YCbCr, HSV, LAB...
        return im.convert("RGB")
    except ValueError as e:
        raise ImageRejected(f"Images in Pillow mode {im.mode!r} are not supported.") from e


def _to_uint8(a, mode):
    """Scales a 16-bit, 32-bit integer or float array into uint8.

    "I;16*" is divided by 257 (65535 -> 255) whatever its content; "F" in 0..1 is multiplied by 255;
    "I" in 0..255 is kept and in 0..65535 (how Pillow opens some 16-bit PNG/TIFF) divided by 257;
    anything else is min-max scaled.
    """
    a = np.nan_to_num(a.astype("float64"), posinf=0.0, neginf=0.0)
    lo, hi = (float(a.min()), float(a.max())) if a.size else (0.0, 0.0)
    if mode.startswith("I;16"):
        scaled = a / 257
    elif mode == "F" and lo >= 0 and hi <= 1:
        scaled = a * 255
    elif lo >= 0 and hi <= 255:
        scaled = a
    elif mode == "I" and lo >= 0 and hi <= 65535:
        scaled = a / 257
    else:
        scaled = (a - lo) / max(hi - lo, 1e-12) * 255
    return np.clip(np.rint(scaled), 0, 255).astype("uint8")
