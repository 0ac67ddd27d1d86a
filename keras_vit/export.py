"""Export a ViT for serving: TensorFlow SavedModel, ONNX, OpenVINO IR and LiteRT (TFLite).

The artifact takes uint8 images (B, H, W, C) at the model's resolution, normalizes them inside
with the model's `image_mean` / `image_std`, and returns class probabilities (B, num_classes) in
float32. The conversion itself is Keras' `Model.export`; this module wraps the model in that
serving signature, checks the backend can produce the format, and writes the class names and the
preprocessing into the artifact's metadata.
"""

import json
import os

import keras
from keras import ops

FORMATS = ("tf_saved_model", "onnx", "openvino", "litert")

# The backends on which Keras produces a working artifact of each format from a keras_vit.ViT
# (each pair is exercised by tests/test_export.py). Keras' torch routes to SavedModel and LiteRT need
# torch_xla and litert-torch, which are not installable next to this project's torch and gradio; JAX
# has no LiteRT route in Keras. A model saved as .keras loads on any backend, so export it from one
# of these.
BACKENDS = {
    "tf_saved_model": ("tensorflow", "jax"),
    "onnx": ("tensorflow", "jax", "torch"),
    "openvino": ("tensorflow", "jax", "torch"),
    "litert": ("tensorflow",),
}

METADATA_KEY = "keras_vit"


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
        # Normalized channels-first and handed back channels-last: the exported patch convolution
        # runs channels-first, so the two transposes meet and cancel and OpenVINO folds the
        # per-channel scale into the convolution. Channels-last (ViT.normalize) it stayed an unfused
        # multiply-add over (B, H, W, C), about 3% of a ViT-S/16 step.
        x = ops.cast(ops.transpose(pixels, (0, 3, 1, 2)), "float32")  # (B, H, W, C) -> (B, C, H, W)
        mean, std = (ops.reshape(ops.convert_to_tensor(v, "float32"), (-1, 1, 1))  # (C,) -> (C, 1, 1)
                     for v in (self.vit.image_mean, self.vit.image_std))
        x = ops.transpose((x / 255.0 - mean) / std, (0, 2, 3, 1))  # the formula of ViT.normalize
        return ops.softmax(self.vit(x, training=False), axis=-1)


def metadata(model):
    """What a client needs to feed the artifact and read its output, as a JSON-able dict."""
    names = model.class_names or tuple(str(i) for i in range(model.num_classes))
    return {
        "class_names": list(names),
        "input": "uint8 pixels (batch, height, width, channels), RGB; normalized inside",
        "image_size": list(model.image_size),
        "num_channels": model.num_channels,
        "image_mean": list(model.image_mean),
        "image_std": list(model.image_std),
        "normalization": "(pixels / 255 - image_mean) / image_std",
        "output": "class probabilities (batch, num_classes), float32 softmax",
        "preset": model.preset,
    }


def export(model, path, format="tf_saved_model", batch_size=None):
    """Writes `model` as a serving artifact at `path` and returns `path`.

    Args:
        model: a `keras_vit.ViT` (float32 weights) with num_classes > 0.
        path: a directory for "tf_saved_model", else a file (".onnx", ".xml" for OpenVINO, which
            also writes the ".bin" beside it, ".tflite").
        format: one of `FORMATS`; the backends that can produce each are in `BACKENDS`.
        batch_size: None for any batch size, or a fixed B.

    Returns:
        `path`. The metadata (`metadata(model)`) is stored in the format's own place: ONNX
        `metadata_props`, OpenVINO `rt_info`, LiteRT model metadata, and for a SavedModel the
        file `assets.extra/keras_vit.json` (the folder TensorFlow keeps for files that are not
        loaded by the graph).
    """
    _check(model, path, format)
    path = os.fspath(path)
    spec = keras.InputSpec(shape=(batch_size, *model.image_size, model.num_channels), dtype="uint8", name="pixels")
    serving = ServingModel(model)
    serving.build(spec.shape)
    backend = keras.backend.backend()
    if format == "onnx" and backend == "torch":
        _torch_onnx(serving, path, spec)
    elif format == "openvino" and backend in ("jax", "torch"):
        _openvino_via_onnx(serving, path, spec)
    else:
        serving.export(path, format=format, input_signature=[spec], verbose=False)
    _WRITERS[format](path, json.dumps(metadata(model)))
    return path


def _torch_onnx(serving, path, spec):
    """torch's dynamo ONNX exporter with a dynamic batch. Keras hands a dynamic batch to the
    TorchScript exporter instead, which fails on the shape arithmetic of Keras' LayerNormalization
    (a `Gather` of the traced shape)."""
    import numpy as np
    import torch

    sample = torch.from_numpy(np.zeros((2, *spec.shape[1:]), "uint8"))
    batch = spec.shape[0] or torch.export.Dim("batch", min=1)
    serving.eval()
    program = torch.onnx.export(serving, (sample,), dynamo=True, input_names=[spec.name], verbose=False,
                                dynamic_shapes={"args": ({0: batch},)})  # Keras layers take *args
    program.optimize()
    program.save(path)


def _openvino_via_onnx(serving, path, spec):
    """OpenVINO IR converted from the ONNX export. On JAX, Keras' own route goes through jax2tf,
    whose `XlaCallModule` op OpenVINO cannot convert. On torch, Keras' route traces with TorchScript;
    from the dynamo ONNX graph (the route timm's models take) OpenVINO ran ViT-S/16 faster."""
    import tempfile

    import openvino as ov

    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = os.path.join(tmp, "model.onnx")
        if keras.backend.backend() == "torch":
            _torch_onnx(serving, onnx_path, spec)
        else:
            serving.export(onnx_path, format="onnx", input_signature=[spec], verbose=False)
        ov.save_model(ov.convert_model(onnx_path), path, compress_to_fp16=False)


def _check(model, path, format):
    if format not in FORMATS:
        raise ValueError(f"format={format!r} is not allowed; use one of {FORMATS}")
    if format == "openvino" and not os.fspath(path).endswith(".xml"):
        raise ValueError(f"path={os.fspath(path)!r}: OpenVINO IR is written as NAME.xml (and NAME.bin); end the path in .xml")
    backend = keras.backend.backend()
    if backend not in BACKENDS[format]:
        raise ValueError(
            f"format={format!r} cannot be exported on the {backend} backend; the backends that can "
            f"export it are {BACKENDS[format]}: save the model (.keras) and export it under one of them "
            "(KERAS_BACKEND)"
        )
    if not getattr(model, "num_classes", 0):
        raise ValueError("export needs a classifier: the model has num_classes=0; build it with num_classes > 0")


def _write_saved_model(path, text):
    os.makedirs(os.path.join(path, "assets.extra"), exist_ok=True)
    with open(os.path.join(path, "assets.extra", f"{METADATA_KEY}.json"), "w") as f:
        f.write(text)


def _write_onnx(path, text):
    import onnx

    proto = onnx.load(path)
    onnx.helper.set_model_props(proto, {METADATA_KEY: text})
    onnx.save(proto, path)


def _write_openvino(path, text):
    import openvino as ov
    import openvino.passes

    ir = ov.Core().read_model(path)
    # Weights computed from weights (the attention's fused QKV kernel is a concatenation of three)
    # become plain constants: NNCF quantizes only matmuls whose weights are constants, and left
    # these in float32.
    passes = ov.passes.Manager()
    passes.register_pass(ov.passes.ConstantFolding())
    passes.run_passes(ir)
    ir.set_rt_info(text, [METADATA_KEY])
    # Saved beside and then moved over: OpenVINO maps the .bin it read, and overwriting a mapped file
    # in place kills the process (SIGBUS). compress_to_fp16=False: the default halves the weights.
    tmp = path[: -len(".xml")] + ".tmp.xml"
    ov.save_model(ir, tmp, compress_to_fp16=False)
    del ir
    for old, new in ((tmp, path), (tmp[:-4] + ".bin", path[:-4] + ".bin")):
        os.replace(old, new)


def _write_litert(path, text):
    # TFLite's flatbuffer has a metadata table (name -> buffer); TensorFlow's flatbuffer_utils reads
    # and writes it. There is no maintained metadata writer in ai-edge-litert.
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils

    tflite = flatbuffer_utils.read_model(path)
    buffer = schema.BufferT()
    buffer.data = list(text.encode())
    tflite.buffers.append(buffer)
    entry = schema.MetadataT()
    entry.name, entry.buffer = METADATA_KEY, len(tflite.buffers) - 1
    tflite.metadata = (tflite.metadata or []) + [entry]
    flatbuffer_utils.write_model(tflite, path)


_WRITERS = {
    "tf_saved_model": _write_saved_model,
    "onnx": _write_onnx,
    "openvino": _write_openvino,
    "litert": _write_litert,
}
