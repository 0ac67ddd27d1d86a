"""Step functions, built inside a worker whose KERAS_BACKEND is already set.

`build(spec, device)` returns (step, items, info): `step()` runs one unit of work and returns only
once the device has finished it (so wall time is its cost); `items` is the number of images (or,
for matmul, 1) it processes; `info` is a dict of findings (the bf16 check) or None. Random weights
throughout: the time of a dense forward pass does not depend on the values.

Serving steps (impl "serving") run a ViT exported to a runtime on uint8 images (B, H, W, C); both
libraries' graphs do the same work: uint8 pixels in, normalization, the ViT, softmax out. keras_vit's
comes from `keras_vit.export` in the torch worker (its graph is the lean one: for ViT-S/16 the ONNX
file has 439 nodes, against 1,322 from the TensorFlow backend's tf2onnx and 461 for timm's); timm's
from `torch.onnx.export` (dynamo) of the same wrapper around timm's VisionTransformer, which OpenVINO
reads from the ONNX file. Their spec: source "keras_vit" or "timm", runtime "onnxruntime" or
"openvino", precision "f32", "bf16" (OpenVINO's INFERENCE_PRECISION_HINT) or "int8" (NNCF, calibrated
on 32 random images: speed does not depend on the values).
"""

import os
import tempfile

import numpy as np

from benchmarks import cases, models


def build(spec, device):
    impl = spec["impl"]
    if impl == "bf16_check":
        return None, 0, bf16_check()
    step, items = _build_step(spec, device)
    return step, items, None


def _build_step(spec, device):
    impl = spec["impl"]
    if impl == "gemm":
        return gemm(spec["backend"], spec["dtype"], spec.get("repeat", 1), device), 1
    if impl == "pipeline":
        return pipeline(spec["batch"], spec["batches"]), spec["batch"] * spec["batches"]
    if impl == "app":
        return app_predict(spec["model"]), 1
    if impl == "timm":
        return timm_step(spec, device), spec["batch"]
    if impl == "serving":
        return serving_step(spec), spec["batch"]
    model = models.keras_model(spec)
    if spec["task"] == "train":
        return keras_train_step(model, spec), spec["batch"]
    return keras_infer_step(model, spec), spec["batch"]


def _data(spec, seed=0):
    m = spec["model"]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((spec["batch"], m["image_size"], m["image_size"], m.get("num_channels", 3)), "float32")
    y = np.eye(m["num_classes"], dtype="float32")[rng.integers(0, m["num_classes"], spec["batch"])]
    return x, y


def keras_infer_step(model, spec):
    """The compiled forward pass each backend offers: XLA on TF and JAX, eager (or torch.compile) on torch."""
    import keras

    x, _ = _data(spec)
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        # "no-xla": TF's own graph executor, whose CPU matmuls are oneDNN's.
        fn = tf.function(lambda t: model(t, training=False), jit_compile=spec.get("variant") != "no-xla")
        xt = tf.constant(x)
        return lambda: fn(xt).numpy()
    if backend == "jax":
        import jax

        tv = [v.value for v in model.trainable_variables]
        ntv = [v.value for v in model.non_trainable_variables]

        @jax.jit
        def fn(tv, ntv, t):
            return model.stateless_call(tv, ntv, t, training=False)[0]

        xj = jax.device_put(x)
        return lambda: fn(tv, ntv, xj).block_until_ready()
    import torch

    xt = keras.ops.convert_to_tensor(x)
    call = torch.compile(model) if spec.get("compile") else model

    def step():
        with torch.no_grad():
            return call(xt, training=False).cpu()

    return step


def keras_train_step(model, spec):
    """`train_on_batch` of a model compiled as training.loop compiles it: AdamW, XLA except on torch
    (and except for the "no-xla" variant, a recipe's jit_compile=False)."""
    import keras

    x, y = _data(spec)
    model.compile(
        optimizer=keras.optimizers.AdamW(1e-3, weight_decay=0.05),
        loss=keras.losses.CategoricalCrossentropy(from_logits=True),
        jit_compile=((keras.backend.backend() != "torch" or bool(spec.get("compile")))
                     and spec.get("variant") != "no-xla"),
    )
    x, y = keras.ops.convert_to_tensor(x), keras.ops.convert_to_tensor(y)
    return lambda: model.train_on_batch(x, y)


def timm_step(spec, device):
    """timm's VisionTransformer: forward under no_grad, or an AdamW train step (bf16 by autocast in both)."""
    import torch

    dev = torch.device("cuda" if device == "gpu" else "cpu")
    model = models.timm_model(spec["model"]).to(dev)
    x, y = _data(spec)
    x = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous().to(dev)  # (B, H, W, C) -> (B, C, H, W)
    labels = torch.from_numpy(y.argmax(-1)).to(dev)
    call = torch.compile(model) if spec.get("compile") else model
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    if spec["task"] == "infer":
        model.eval()
        bf16 = spec["dtype"] == "mixed_bfloat16"

        def infer():
            with torch.no_grad(), torch.autocast(dev.type, torch.bfloat16, enabled=bf16):
                out = call(x)
            sync()
            return out

        return infer
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    model.train()

    bf16 = spec.get("dtype") == "mixed_bfloat16"

    def train():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, torch.bfloat16, enabled=bf16):
            loss = torch.nn.functional.cross_entropy(call(x), labels)
        loss.backward()
        opt.step()
        return loss.item()

    return train


FORMAT = {"onnxruntime": "onnx", "openvino": "openvino"}


def serving_step(spec):
    """() -> probabilities for one batch of random uint8 images, through the spec's artifact."""
    from keras_vit import serving

    m = spec["model"]
    shape = (m["image_size"], m["image_size"], m.get("num_channels", 3))
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (spec["batch"], *shape), dtype="uint8")
    folder = serving_folder()
    path = serving_artifact(spec, folder)
    precision = spec["precision"]
    if precision == "int8":
        path = serving.quantize_int8(path, os.path.join(folder, "int8.xml"),
                                     rng.integers(0, 256, (32, *shape), dtype="uint8"))
        precision = "f32"  # the int8 matmuls run as int8; the rest stays f32
    fn = serving.load(path, FORMAT[spec["runtime"]], precision=precision)
    return lambda: fn(pixels)


def serving_folder():
    """A temporary folder for the artifacts, removed when the process exits (a runtime may still map
    the files it loaded, so not before)."""
    import atexit
    import shutil

    folder = tempfile.mkdtemp(prefix="serving-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def serving_artifact(spec, folder):
    """The graph of the spec's source ("keras_vit", "timm") for its runtime, written in `folder`:
    the .onnx or OpenVINO .xml path."""
    return (_keras_vit_artifact if spec["source"] == "keras_vit" else _timm_artifact)(spec, folder)


def _keras_vit_artifact(spec, folder):
    import keras_vit

    model = models.keras_model({**spec, "impl": "keras_vit", "dtype": "float32"})
    suffix = ".xml" if spec["runtime"] == "openvino" else ".onnx"
    return keras_vit.export(model, os.path.join(folder, "model" + suffix), format=FORMAT[spec["runtime"]])


def _timm_artifact(spec, folder):
    """timm's model behind the same uint8 -> probabilities wrapper, as ONNX (and OpenVINO IR)."""
    import torch

    net = models.timm_model(spec["model"]).eval()

    class Serving(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, pixels):  # (B, H, W, C) uint8, normalized with mean = std = 0.5 as keras_vit's default
            x = (pixels.permute(0, 3, 1, 2).float() / 255.0 - 0.5) / 0.5  # -> (B, C, H, W)
            return torch.softmax(self.net(x), dim=-1)

    m = spec["model"]
    sample = torch.zeros((2, m["image_size"], m["image_size"], m.get("num_channels", 3)), dtype=torch.uint8)
    onnx_path = os.path.join(folder, "timm.onnx")
    program = torch.onnx.export(Serving().eval(), (sample,), dynamo=True, input_names=["pixels"],
                                dynamic_shapes=({0: torch.export.Dim("batch", min=1)},))
    program.optimize()
    program.save(onnx_path)
    if spec["runtime"] == "onnxruntime":
        return onnx_path
    import openvino as ov

    xml = os.path.join(folder, "timm.xml")
    ov.save_model(ov.convert_model(onnx_path), xml, compress_to_fp16=False)
    return xml


def gemm(backend, dtype, repeat, device):
    """`repeat` products of two (N, N) matrices."""
    n = cases.GEMM_N
    a = np.random.default_rng(0).standard_normal((n, n), "float32")
    if backend == "tensorflow":
        import tensorflow as tf

        ta = tf.cast(tf.constant(a), dtype)
        # Distinct products, summed: grappler would prune unused ones and merge identical ones.
        fn = tf.function(lambda m: tf.add_n([tf.linalg.matmul(m + float(i), m) for i in range(repeat)]))
        return lambda: fn(ta).numpy()
    if backend == "jax":
        import jax
        import jax.numpy as jnp

        ja = jax.device_put(a).astype(dtype)
        return lambda: [jnp.matmul(ja, ja) for _ in range(repeat)][-1].block_until_ready()
    import torch

    ta = torch.from_numpy(a).to(getattr(torch, dtype)).to("cuda" if device == "gpu" else "cpu")
    sync = torch.cuda.synchronize if device == "gpu" else (lambda: None)

    def step():
        for _ in range(repeat):
            out = ta @ ta
        sync()
        return out

    return step


def pipeline(batch, batches):
    """`batches` batches of the Fashion-MNIST recipe's training pipeline (training.datasets)."""
    import keras_vit
    from training import datasets, recipes

    r = recipes.get("fashion_mnist", batch_size=batch)
    ds, info = datasets.load(r.dataset, r.train_split, seed=r.seed)
    preprocessing = keras_vit.Preprocessing((r.image_size,) * 2, (0.5,), (0.5,), channels=info.num_channels)
    ds = datasets.pipeline(ds, info, preprocessing, r.batch_size, training=True, recipe=r, seed=r.seed)
    it = iter(ds.repeat())

    def step():
        for _ in range(batches):
            images, _ = next(it)
        return images

    return step


def app_predict(model_config):
    """One `apps.inference.Predictor.predict` call with the rollout overlay, on a shipped example image."""
    import keras_vit
    from apps.sources import DEFAULT_CHECKPOINT, class_labels
    from apps.inference import Predictor, Settings
    from apps.inference import ROLLOUT

    if DEFAULT_CHECKPOINT.exists():
        model = keras_vit.load(DEFAULT_CHECKPOINT)
    else:  # same architecture, untrained: the latency does not depend on the weights
        model = models.keras_model(dict(impl="keras_vit", model=model_config, dtype="float32"))
    predictor = Predictor(model, class_labels(model))
    assets = os.path.join(os.path.dirname(os.path.dirname(__file__)), "apps", "assets")
    image = os.path.join(assets, sorted(f for f in os.listdir(assets) if f.endswith(".png"))[0])
    return lambda: predictor.predict(image, Settings(view=ROLLOUT))


def _fmnist_checkpoint_or_none():
    import keras_vit
    from apps.sources import DEFAULT_CHECKPOINT

    if not DEFAULT_CHECKPOINT.exists():
        return None, None
    # Recorded relative to the repository, so that a saved run names no machine's folders.
    return keras_vit.load(DEFAULT_CHECKPOINT), str(DEFAULT_CHECKPOINT.relative_to(DEFAULT_CHECKPOINT.parents[2]))


def bf16_check():
    """Largest |logit difference| between the shipped checkpoint run in float32 and the same weights
    under `mixed_bfloat16`, on the app's example images (the report's limit: 2e-2)."""
    import keras
    from PIL import Image

    import keras_vit

    model, path = _fmnist_checkpoint_or_none()
    if model is None:
        return dict(checkpoint=None, note="no shipped checkpoint (checkpoints/fashion-mnist-vit/model.keras) yet")
    config = dict(model.get_config(), dtype="mixed_bfloat16")
    half = keras_vit.ViT.from_config(config)
    half.set_weights(model.get_weights())
    assets = os.path.join(os.path.dirname(os.path.dirname(__file__)), "apps", "assets")
    files = sorted(f for f in os.listdir(assets) if f.endswith(".png"))
    pixels = np.stack([model.preprocessing.prepare(Image.open(os.path.join(assets, f))) for f in files])  # (B, H, W, C)
    x = model.normalize(keras.ops.convert_to_tensor(pixels))
    a = keras.ops.convert_to_numpy(model(x, training=False))
    b = keras.ops.convert_to_numpy(keras.ops.cast(half(x, training=False), "float32"))
    # The proposed change: the classifier in float32 on the bf16 features, since rounding the logits
    # themselves to bf16 (8 bits of mantissa) alone costs up to 2^-6 = 0.016 at |logit| in [4, 8).
    features = keras.ops.cast(half.forward_features(x, training=False), "float32")  # (B, T, D)
    c = keras.ops.convert_to_numpy(model.head(features))
    return dict(checkpoint=path, images=len(files), max_abs_logit_diff=float(np.abs(a - b).max()),
                max_abs_logit_diff_fp32_head=float(np.abs(a - c).max()),
                top1_agree=float((a.argmax(-1) == b.argmax(-1)).mean()), logit_range=float(np.ptp(a)))
