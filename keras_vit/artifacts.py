"""The serving-artifact formats, one `ArtifactFormat` record each: the backends that write it, the writer,
where its metadata goes, and the runtime that runs it.

`keras_vit.export` writes an artifact through its format's record and `keras_vit.serving` runs one,
so a new format is one new record here. Every artifact takes uint8 pixels (B, H, W, C) and returns
class probabilities (B, num_classes), float32; the metadata is JSON under `METADATA_KEY`.
"""

import dataclasses
import json
import os
import typing

import keras
import numpy as np

from keras_vit import naflex

METADATA_KEY = "keras_vit"


@dataclasses.dataclass(frozen=True)
class ArtifactFormat:
    """One artifact format.

    Attributes:
        name: the `format=` of `keras_vit.export` and `keras_vit.serving`.
        backends: the Keras backends on which `write` produces a working artifact from a
            `keras_vit.ViT` (tests/export/test_export.py runs each pair).
        write: (serving model, path, input spec) -> None: writes the artifact.
        write_metadata: (path, JSON text) -> None: stores the metadata in the format's own place.
        read_metadata: path -> the stored dict.
        load: (path, precision, threads) -> a function from uint8 pixels (B, H, W, C) (NumPy) to
            probabilities (B, num_classes) (NumPy float32), run in the format's runtime.
        precisions: the `precision` values `load` takes.
        suffix: the ending the path must have, or None for any path.
    """

    name: str
    backends: tuple
    write: typing.Callable
    write_metadata: typing.Callable
    read_metadata: typing.Callable
    load: typing.Callable
    precisions: tuple = ("f32",)
    suffix: typing.Optional[str] = None


def get(name):
    """The `ArtifactFormat` called `name`; ValueError naming the formats for any other name."""
    if name not in FORMATS:
        raise ValueError(f"format={name!r} is not allowed; use one of {tuple(FORMATS)}")
    return FORMATS[name]


def _keras_route(name):
    """Keras' own exporter (`Model.export`) for format `name`."""
    def write(serving, path, spec):
        return serving.export(path, format=name, input_signature=[spec], verbose=False, **_jax_shapes(serving, spec))
    return write


def _jax_shapes(serving, spec):
    """On JAX, free sides declared as multiples of the patch to jax2tf: from free symbols it cannot
    prove that the patch grid's size is non-negative."""
    if keras.backend.backend() != "jax" or None not in spec.shape[1:3]:
        return {}
    step = serving.vit.token_pixels
    sides = [f"{step}*{name}" if n is None else str(n) for n, name in zip(spec.shape[1:3], ("h", "w"))]
    shape = f"({spec.shape[0] or 'batch'}, {', '.join(sides)}, {spec.shape[3]})"
    return {"jax2tf_kwargs": {"polymorphic_shapes": [shape]}}


# TensorFlow SavedModel: a folder. The metadata goes to assets.extra/, which TensorFlow keeps for
# files that the graph does not load.
def _saved_model_metadata_path(path):
    return os.path.join(path, "assets.extra", f"{METADATA_KEY}.json")


def _saved_model_write_metadata(path, text):
    os.makedirs(os.path.dirname(_saved_model_metadata_path(path)), exist_ok=True)
    with open(_saved_model_metadata_path(path), "w") as f:
        f.write(text)


def _saved_model_read_metadata(path):
    with open(_saved_model_metadata_path(path)) as f:
        return json.load(f)


def _saved_model_load(path, precision, threads):
    import tensorflow as tf

    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
    loaded = tf.saved_model.load(path)  # kept alive by the closure: `serve` refers to its variables
    return lambda pixels: loaded.serve(*[tf.constant(v) for v in _inputs(pixels)]).numpy()


def _inputs(pixels):
    """An artifact's inputs in order: the pixels, or the three arrays of a patch-sequence dict."""
    if isinstance(pixels, dict):
        return [pixels[k] for k in naflex.KEYS]
    return [pixels]


# ONNX, run by ONNX Runtime; the metadata is a `metadata_props` entry.
def _onnx_write(serving, path, spec):
    if keras.backend.backend() == "torch":
        _torch_onnx(serving, path, spec)
    else:  # tf2onnx on TensorFlow, jax2onnx on JAX
        _keras_route("onnx")(serving, path, spec)


def _torch_onnx(serving, path, spec):
    """torch's dynamo ONNX exporter with a dynamic batch. Keras hands a dynamic batch to the
    TorchScript exporter instead, which fails on the shape arithmetic of Keras' LayerNormalization
    (a `Gather` of the traced shape)."""
    import torch

    step = serving.vit.token_pixels
    height, width = (n or 2 * step for n in spec.shape[1:3])
    sample = torch.from_numpy(np.zeros((2, height, width, spec.shape[3]), "uint8"))
    dims = {0: spec.shape[0] or torch.export.Dim("batch", min=1)}
    for axis, name in ((1, "height"), (2, "width")):  # free sides: multiples of the patch
        if spec.shape[axis] is None:
            dims[axis] = step * torch.export.Dim(f"{name}_tokens", min=1)
    serving.eval()
    program = torch.onnx.export(serving, (sample,), dynamo=True, input_names=[spec.name], verbose=False,
                                dynamic_shapes={"args": (dims,)})  # Keras layers take *args
    program.optimize()
    program.save(path)


def _onnx_write_metadata(path, text):
    import onnx

    proto = onnx.load(path)
    onnx.helper.set_model_props(proto, {METADATA_KEY: text})
    onnx.save(proto, path)


def _onnx_read_metadata(path):
    import onnx

    props = {p.key: p.value for p in onnx.load(path, load_external_data=False).metadata_props}
    return json.loads(props[METADATA_KEY])


def _onnx_load(path, precision, threads):
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return lambda pixels: session.run(None, dict(zip(names, _inputs(pixels))))[0]


# OpenVINO IR: NAME.xml and its weights NAME.bin; the metadata is an `rt_info` entry.
def _openvino_write(serving, path, spec):
    """Keras' route on TensorFlow; elsewhere, the IR converted from the ONNX export. On JAX, Keras'
    route goes through jax2tf, whose `XlaCallModule` op OpenVINO cannot convert. On torch, Keras'
    route traces with TorchScript; from the dynamo ONNX graph (the route timm's models take)
    OpenVINO ran ViT-S/16 faster."""
    import tempfile

    import openvino as ov

    if keras.backend.backend() == "tensorflow":
        return _keras_route("openvino")(serving, path, spec)
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = os.path.join(tmp, "model.onnx")
        _onnx_write(serving, onnx_path, spec)
        ov.save_model(ov.convert_model(onnx_path), path, compress_to_fp16=False)


def _openvino_write_metadata(path, text):
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


def _openvino_read_metadata(path):
    import openvino as ov

    return json.loads(ov.Core().read_model(path).get_rt_info([METADATA_KEY]).astype(str))


def _openvino_load(path, precision, threads):
    import openvino as ov

    config = {"INFERENCE_PRECISION_HINT": precision}
    if threads:
        config["INFERENCE_NUM_THREADS"] = threads
    compiled = ov.Core().compile_model(path, "CPU", config)
    request = compiled.create_infer_request()
    return lambda pixels: np.array(request.infer([pixels])[0])


# LiteRT (TFLite): the flatbuffer's metadata table (name -> buffer), which TensorFlow's
# flatbuffer_utils reads and writes; ai-edge-litert has no maintained metadata writer.
def _litert_write_metadata(path, text):
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


def _litert_read_metadata(path):
    from tensorflow.lite.tools import flatbuffer_utils

    tflite = flatbuffer_utils.read_model(path)
    entry = next(m for m in tflite.metadata if m.name.decode() == METADATA_KEY)
    return json.loads(bytes(tflite.buffers[entry.buffer].data).decode())


def _litert_load(path, precision, threads):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=path, num_threads=threads or None)
    runner = interpreter.get_signature_runner()
    (name,) = runner.get_input_details()

    def predict(pixels):
        (out,) = runner(**{name: pixels}).values()
        return out

    return predict


# Keras' torch routes to SavedModel and LiteRT need torch_xla and litert-torch, which are not
# installable next to this project's torch and gradio; JAX has no LiteRT route in Keras. A model
# saved as .keras loads on any backend, so export it from one of the listed ones.
FORMATS = {f.name: f for f in (
    ArtifactFormat("tf_saved_model", ("tensorflow", "jax"), _keras_route("tf_saved_model"), _saved_model_write_metadata,
           _saved_model_read_metadata, _saved_model_load),
    ArtifactFormat("onnx", ("tensorflow", "jax", "torch"), _onnx_write, _onnx_write_metadata, _onnx_read_metadata,
           _onnx_load),
    # bf16: OpenVINO's INFERENCE_PRECISION_HINT (its default on CPUs with AMX or AVX512-BF16).
    ArtifactFormat("openvino", ("tensorflow", "jax", "torch"), _openvino_write, _openvino_write_metadata,
           _openvino_read_metadata, _openvino_load, precisions=("f32", "bf16"), suffix=".xml"),
    ArtifactFormat("litert", ("tensorflow",), _keras_route("litert"), _litert_write_metadata, _litert_read_metadata,
           _litert_load),
)}
