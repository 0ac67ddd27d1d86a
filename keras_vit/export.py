"""Export a ViT for serving: TensorFlow SavedModel, ONNX, OpenVINO IR and LiteRT (TFLite).

The artifact takes uint8 images (B, H, W, C) at the model's resolution, as the model's
`Preprocessing.prepare` makes them (its record is in the metadata), normalizes them inside with
`Preprocessing.normalize`, and returns class probabilities (B, num_classes) in float32. The
conversion itself is Keras' `Model.export`; this module wraps the model in that serving signature,
checks the backend can produce the format, and writes the class names and the preprocessing into
the artifact's metadata. What differs between formats is in their `ArtifactFormat` records
(`keras_vit.artifacts`).

A model of patch sequences (`max_seq_len`, see `keras_vit.naflex`) is exported as one: the artifact
takes the three arrays of a padded batch, of any length, the patches as resized pixels in [0, 255]
(`naflex.patch_sequences(..., normalize=False)`), and normalizes them inside
(`SequenceServingModel`).
"""

import json
import os

import keras
from keras import ops

from keras_vit import artifacts

# The formats, each with its backends, writer, metadata and runtime (`keras_vit.artifacts`).
FORMATS = artifacts.FORMATS
# The formats whose artifacts can leave the height and width free (a model with `dynamic_image_size`),
# and the backends that write them so. On JAX, ONNX and OpenVINO go through jax2onnx, whose free
# symbols cannot be declared multiples of the patch, and the patch grid's size is then unprovable.
DYNAMIC_FORMATS = {"tf_saved_model": ("tensorflow", "jax"), "onnx": ("tensorflow", "torch"),
                   "openvino": ("tensorflow", "torch")}
# The formats that take patch sequences of a free length, and the backends that write them so
# (tests/export/test_export.py runs each pair).
SEQUENCE_FORMATS = {"tf_saved_model": ("tensorflow",), "onnx": ("tensorflow",)}


class ServingModel(keras.Model):
    """uint8 pixels (B, H, W, C) -> class probabilities (B, num_classes), float32.

    Args:
        vit: a `keras_vit.ViT` with a classifier head (num_classes > 0).
    """

    def __init__(self, vit, **kwargs):
        super().__init__(name=kwargs.pop("name", "serving"), **kwargs)
        self.vit = vit

    def build(self, input_shape):
        pass  # the ViT is built already; Keras' exporters only check that this model is

    def call(self, pixels):
        return ops.softmax(self.vit(self.inputs(pixels), training=False), axis=-1)

    def inputs(self, pixels):
        """The ViT's input: uint8 pixels (B, H, W, C) normalized by the model's `preprocessing`.

        Normalized channels-first and handed back channels-last: the exported patch convolution
        runs channels-first, so the two transposes meet and cancel and OpenVINO folds the
        per-channel scale into the convolution. Channels-last (ViT.normalize) it stayed an unfused
        multiply-add over (B, H, W, C), about 3% of a ViT-S/16 step.
        """
        x = ops.transpose(pixels, (0, 3, 1, 2))  # (B, H, W, C) -> (B, C, H, W)
        return ops.transpose(self.vit.preprocessing.normalize(x, channels_first=True), (0, 2, 3, 1))  # and back


class SequenceServingModel(ServingModel):
    """Patch sequences -> class probabilities (B, num_classes), float32.

    Inputs, in this order: `patches` (B, L, P * P * C) float32, each patch's resized pixels in
    [0, 255], flattened row, column, channel (`keras_vit.naflex`); `patch_coord` (B, L, 2) int32;
    `patch_valid` (B, L) bool. The patches are normalized inside by the model's `preprocessing`.

    Args:
        vit: a `keras_vit.ViT` with a classifier head (num_classes > 0) and a `max_seq_len`.
    """

    def call(self, patches, patch_coord, patch_valid):
        shape = ops.shape(patches)
        cells = ops.reshape(patches, (shape[0], shape[1], -1, self.vit.num_channels))  # (B, L, P P, C)
        x = ops.reshape(self.vit.preprocessing.normalize(cells), shape)
        inputs = {"patches": x, "patch_coord": patch_coord, "patch_valid": patch_valid}
        return ops.softmax(self.vit(inputs, training=False), axis=-1)


def metadata(model, size=None):
    """What a client needs to feed the artifact and read its output, as a JSON-able dict; `size`
    is the artifact's input (H, W), None for a free side (default: the model's `image_size`)."""
    names = model.class_names or tuple(str(i) for i in range(model.num_classes))
    return {
        "class_names": list(names),
        "input": "uint8 pixels (batch, height, width, channels), RGB; normalized inside",
        "image_size": list(model.image_size),
        "input_size": list(size or model.image_size),  # null: any multiple of "patch_pixels"
        "patch_pixels": model.token_pixels,
        "num_channels": model.num_channels,
        "image_mean": list(model.image_mean),
        "image_std": list(model.image_std),
        "normalization": "(pixels / 255 - image_mean) / image_std",
        # How an image becomes those pixels: keras_vit.Preprocessing.from_config(...).prepare(image).
        "preprocessing": model.preprocessing.get_config(),
        "output": "class probabilities (batch, num_classes), float32 softmax",
        "preset": model.preset,
        **({} if model.max_seq_len is None else {
            "input": "patch sequences of any length: patches float32 (batch, length, patch_size * patch_size * "
                     "channels), each patch's resized pixels in [0, 255] by row, column, channel; patch_coord int32 "
                     "(batch, length, 2), (row, column) on the image's patch grid; patch_valid bool (batch, "
                     "length); normalized inside (keras_vit.naflex.patch_sequences(images, patch_size, "
                     "max_seq_len, normalize=False) makes them)",
            "input_size": None, "max_seq_len": model.max_seq_len, "patch_size": model.patch_size}),
    }


def export(model, path, format="tf_saved_model", batch_size=None, image_size=None):
    """Writes `model` as a serving artifact at `path` and returns `path`.

    Args:
        model: a `keras_vit.ViT` (float32 weights) with num_classes > 0.
        path: a directory for "tf_saved_model", else a file (".onnx", ".xml" for OpenVINO, which
            also writes the ".bin" beside it, ".tflite").
        format: one of `FORMATS`; the backends that can produce each are in its record
            (`FORMATS[format].backends`).
        batch_size: None for any batch size, or a fixed B.
        image_size: None for the model's `image_size`, or, for a model with
            `dynamic_image_size`, any height and width that the patch divides (formats of
            `DYNAMIC_FORMATS`, on the backends listed there); an int or (H, W) fixes the
            artifact's size (for a dynamic model only, and the one choice for LiteRT).

    Returns:
        `path`. The metadata (`metadata(model)`) is stored in the format's own place: ONNX
        `metadata_props`, OpenVINO `rt_info`, LiteRT model metadata, and for a SavedModel the
        file `assets.extra/keras_vit.json` (the folder TensorFlow keeps for files that are not
        loaded by the graph).
    """
    fmt = _check(model, path, format)
    path = os.fspath(path)
    if model.max_seq_len is not None:
        return _export_sequences(model, path, fmt, batch_size, image_size)
    size = _artifact_size(model, format, image_size)
    spec = keras.InputSpec(shape=(batch_size, *size, model.num_channels), dtype="uint8", name="pixels")
    serving = ServingModel(model)
    serving.build(spec.shape)
    fmt.write(serving, path, spec)
    fmt.write_metadata(path, json.dumps(metadata(model, size)))
    return path


def _export_sequences(model, path, fmt, batch_size, image_size):
    """The artifact of a model with `max_seq_len`: patch sequences of any length in, probabilities out."""
    backend = keras.backend.backend()
    refused = (f"image_size={image_size!r} is not allowed: this model takes patch sequences" if image_size is not None
               else None if backend in SEQUENCE_FORMATS.get(fmt.name, ()) else
               f"format={fmt.name!r} with patch sequences cannot be exported on the {backend} backend; the pairs "
               f"that can are {SEQUENCE_FORMATS}")
    if refused:
        raise ValueError(f"{refused} (max_seq_len={model.max_seq_len}; to export for images, rebuild it with "
                         "max_seq_len=None: keras_vit.models.adapt keeps its weights)")
    width = model.patch_size**2 * model.num_channels
    specs = [keras.InputSpec(shape=(batch_size, None, width), dtype="float32", name="patches"),
             keras.InputSpec(shape=(batch_size, None, 2), dtype="int32", name="patch_coord"),
             keras.InputSpec(shape=(batch_size, None), dtype="bool", name="patch_valid")]
    serving = SequenceServingModel(model)
    serving.build(specs[0].shape)
    serving.export(path, format=fmt.name, input_signature=specs, verbose=False)
    fmt.write_metadata(path, json.dumps(metadata(model)))
    return path


def _artifact_size(model, format, image_size):
    """(H, W) of the artifact's input, None for a free side."""
    if image_size is not None:
        if not getattr(model, "dynamic_image_size", False):
            raise ValueError(f"image_size={image_size!r} is not allowed: this model takes "
                             f"image_size={model.image_size} only; build it with dynamic_image_size=True, "
                             "or keras_vit.resize it")
        size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        model._check_divisible(size)
        return size
    if not getattr(model, "dynamic_image_size", False):
        return model.image_size
    if format not in DYNAMIC_FORMATS:
        raise ValueError(f"format={format!r} takes one fixed image size, and this model has dynamic_image_size; pass "
                         f"image_size=(H, W), e.g. image_size={model.image_size}")
    backend = keras.backend.backend()
    if backend not in DYNAMIC_FORMATS[format]:
        raise ValueError(f"format={format!r} with a free image size cannot be exported on the {backend} backend; "
                         f"export it under one of {DYNAMIC_FORMATS[format]} (KERAS_BACKEND), "
                         "or pass image_size=(H, W), e.g. "
                         f"image_size={model.image_size}")
    return (None, None)


def _check(model, path, format):
    """The `ArtifactFormat` of `format`, once the model, the path and the backend are known to suit it."""
    fmt = artifacts.get(format)
    if fmt.suffix and not os.fspath(path).endswith(fmt.suffix):
        raise ValueError(f"path={os.fspath(path)!r} is not allowed for format={format!r}; end the path in {fmt.suffix}")
    backend = keras.backend.backend()
    if backend not in fmt.backends:
        raise ValueError(
            f"format={format!r} cannot be exported on the {backend} backend; the backends that can "
            f"export it are {fmt.backends}: save the model (.keras) and export it under one of them "
            "(KERAS_BACKEND)"
        )
    if not getattr(model, "num_classes", 0):
        raise ValueError("export needs a classifier: the model has num_classes=0; build it with num_classes > 0")
    if getattr(model, "quantization", None) is not None:
        raise ValueError(f"export takes a float model, and this one is quantized to {model.quantization['mode']!r}; "
                         "export the float model, then quantize the artifact with keras_vit.serving.quantize_int8")
    return fmt
