"""What is timed: the cases, their candidates and the work (FLOPs) of one step.

A case is a group of candidates that do the same work and are timed alternately. A candidate is
a spec dict that `benchmarks.impls.build` turns into a step function inside a worker:
`backend` (the worker that runs it), `impl` (keras_vit, timm, keras_hub, gemm, pipeline, app),
`task` (infer, train) and the model config.
"""

import keras_vit

# The model of the fashion_mnist recipe (training.recipes.FashionMnist), the shipped checkpoint's.
FMNIST = dict(image_size=28, patch_size=4, num_channels=1, hidden_dim=64, num_layers=6, num_heads=4,
              mlp_dim=128, num_classes=10, pooling="gap")
# A small ViT for the training step: 32 px, patch 4, D 192, 6 blocks.
SMALL = dict(image_size=32, patch_size=4, num_channels=3, hidden_dim=192, num_layers=6, num_heads=3,
             mlp_dim=768, num_classes=10)
GEMM_N = 2048


def preset(name, image_size=224, num_classes=1000):
    """The constructor arguments of a paper preset, e.g. "ViT-S/16"."""
    config = dict(keras_vit.preset_config(name))
    config.update(image_size=image_size, num_classes=num_classes)
    return config


def step_flops(spec):
    """FLOPs (2 x multiply-adds) of one step of `spec`; a training step counts 3x the forward."""
    if spec["impl"] == "gemm":
        return 2 * GEMM_N**3 * spec.get("repeat", 1)
    if "model" not in spec or spec["impl"] in ("pipeline", "app"):
        return None
    factor = 3 if spec["task"] == "train" else 1
    return 2 * factor * keras_vit.model_macs(spec["model"])["total"] * spec["batch"]


def _infer(backend, impl, model, batch, dtype="float32", **extra):
    return dict(backend=backend, impl=impl, task="infer", model=model, batch=batch, dtype=dtype, **extra)


def inference_case(name, model, batch, dtype, full):
    """keras_vit on the three backends against timm (eager, compiled) and keras-hub (TF, JAX)."""
    c = [
        _infer("tensorflow", "keras_vit", model, batch, dtype),
        _infer("jax", "keras_vit", model, batch, dtype),
        _infer("torch", "keras_vit", model, batch, dtype),
        _infer("torch", "timm", model, batch, dtype),
        # Keras' own bf16 products, which XLA:CPU runs in float32 (keras_vit.layers.dense).
        *([_infer("jax", "keras_vit", model, batch, dtype, variant="keras-matmul")] if dtype != "float32" else []),
        # jax.nn.dot_product_attention's 4-D products (keras_vit.layers.attention_core).
        _infer("jax", "keras_vit", model, batch, dtype, variant="keras-attention"),
        _infer("tensorflow", "keras_hub", model, batch, dtype),
        _infer("jax", "keras_hub", model, batch, dtype),
        # TF's own executor (oneDNN matmuls) beats XLA:CPU here, for both libraries.
        _infer("tensorflow", "keras_vit", model, batch, dtype, variant="no-xla"),
        _infer("tensorflow", "keras_hub", model, batch, dtype, variant="no-xla"),
        # TensorFlow with its oneDNN kernels off, which is its own default on a CPU without VNNI,
        # AVX-512 bf16 or AMX (the workers turn them on: commands.cli.LIBRARY_ENV). fp32 only: bf16
        # without oneDNN is Eigen's slow emulation.
        *([_infer("tensorflow", "keras_vit", model, batch, dtype, onednn=False),
           _infer("tensorflow", "keras_vit", model, batch, dtype, variant="no-xla", onednn=False)]
          if dtype == "float32" else []),
    ]
    if full:  # last: their compilation is the slow setup
        c += [_infer("torch", "keras_vit", model, batch, dtype, compile=True),
              _infer("torch", "timm", model, batch, dtype, compile=True)]
    return dict(name=name, kind="throughput", candidates=c)


def _serve(backend, source, runtime, precision, model, batch):
    return dict(backend=backend, impl="serving", task="infer", source=source, runtime=runtime,
                precision=precision, model=model, batch=batch)


def serving_case(name, model, batch):
    """Exported graphs in their runtimes (uint8 in, probabilities out) against timm in torch."""
    return dict(name=name, kind="throughput", candidates=[
        _infer("torch", "timm", model, batch, "float32", variant="fp32 eager"),
        _infer("torch", "timm", model, batch, "mixed_bfloat16", variant="bf16 autocast"),
        _serve("torch", "keras_vit", "openvino", "bf16", model, batch),
        _serve("torch", "timm", "openvino", "bf16", model, batch),
        _serve("torch", "keras_vit", "openvino", "int8", model, batch),
        _serve("torch", "timm", "openvino", "int8", model, batch),
        _serve("torch", "keras_vit", "onnxruntime", "f32", model, batch),
        _serve("torch", "timm", "onnxruntime", "f32", model, batch),
    ])


def serving_cases(full):
    """ViT-S/16 and ViT-B/16 at 224 px, batch 1 and 16 (the quick run: ViT-S/16, batch 16)."""
    grid = [("ViT-S/16", 16)] + ([("ViT-S/16", 1), ("ViT-B/16", 1), ("ViT-B/16", 16)] if full else [])
    return [serving_case(f"serve {p} 224 b{b}", preset(p), b) for p, b in grid]


def training_case(full):
    c = [dict(backend=b, impl="keras_vit", task="train", model=SMALL, batch=128)
         for b in ("tensorflow", "jax", "torch")]
    # A recipe's jit_compile=False: TF's own executor, as the fashion_mnist recipe trains.
    c.append(dict(backend="tensorflow", impl="keras_vit", task="train", model=SMALL, batch=128, variant="no-xla"))
    c.append(dict(backend="torch", impl="timm", task="train", model=SMALL, batch=128))
    if full:
        c.append(dict(backend="torch", impl="timm", task="train", model=SMALL, batch=128, compile=True))
    return dict(name="train ViT 32px/4 D192 L6 b128 AdamW", kind="throughput", candidates=c)


def _train(backend, impl, model, batch, dtype, **extra):
    return dict(backend=backend, impl=impl, task="train", model=model, batch=batch, dtype=dtype, **extra)


def training_step_case(name, model, batch, dtype):
    """keras_vit's train step on the three backends against timm's (AdamW; bf16: keras_vit's
    `mixed_bfloat16` policy, timm's `torch.autocast`). The "keras-layernorm" JAX candidate puts
    Keras' own LayerNormalization back in every norm, to show what the closed-form backward gives;
    the "no-xla" TensorFlow candidate is the step without XLA (`jit_compile=False`), TensorFlow's
    own executor with oneDNN's kernels, to choose the faster default per dtype."""
    return dict(name=name, kind="throughput", candidates=[
        _train("tensorflow", "keras_vit", model, batch, dtype),
        _train("tensorflow", "keras_vit", model, batch, dtype, variant="no-xla"),
        _train("jax", "keras_vit", model, batch, dtype),
        _train("torch", "keras_vit", model, batch, dtype),
        _train("torch", "timm", model, batch, dtype),
        _train("jax", "keras_vit", model, batch, dtype, variant="keras-layernorm"),
        *([_train("jax", "keras_vit", model, batch, dtype, variant="keras-matmul")] if dtype != "float32" else []),
        _train("jax", "keras_vit", model, batch, dtype, variant="keras-attention"),
        *([_train("tensorflow", "keras_vit", model, batch, dtype, variant="no-xla", onednn=False)]
          if dtype == "float32" else []),
    ])


def cases(full):
    """Every case, in the order they run."""
    s16, b16 = preset("ViT-S/16"), preset("ViT-B/16")
    out = [
        dict(name="matmul peak 2048^2 fp32", kind="peak", candidates=[
            dict(backend=b, impl="gemm", dtype="float32", repeat=4) for b in ("tensorflow", "jax", "torch")]),
        dict(name="matmul peak 2048^2 bf16", kind="peak", candidates=[
            dict(backend="torch", impl="gemm", dtype="bfloat16", repeat=4)]),
        inference_case("infer ViT-S/16 224 b16 fp32", s16, 16, "float32", full),
        inference_case("infer ViT-S/16 224 b16 bf16", s16, 16, "mixed_bfloat16", full),
        dict(name="bf16 logits check", kind="check", candidates=[
            dict(backend=b, impl="bf16_check") for b in ("tensorflow", "jax", "torch")]),
    ]
    if full:
        out.append(inference_case("infer ViT-B/16 224 b8 fp32", b16, 8, "float32", full))
    out += serving_cases(full)
    out += [
        training_case(full),
        *([training_step_case(f"train ViT-S/16 224 b16 {name}", s16, 16, dtype)
           for name, dtype in (("fp32", "float32"), ("bf16", "mixed_bfloat16"))] if full else []),
        dict(name="Fashion-MNIST: input pipeline vs train step", kind="throughput", candidates=[
            dict(backend="tensorflow", impl="pipeline", batch=128, batches=40),
            *[dict(backend=b, impl="keras_vit", task="train", model=FMNIST, batch=128)
              for b in ("tensorflow", "jax", "torch")]]),
        dict(name="app predict with overlay", kind="latency", candidates=[
            dict(backend=b, impl="app", model=FMNIST) for b in ("tensorflow", "jax", "torch")]),
    ]
    return out


def label(spec):
    """A short, unique name for a candidate."""
    if spec["impl"] == "gemm":
        return f"{spec['backend']} matmul {spec['dtype']}"
    if spec["impl"] == "serving":
        return f"{spec['source']} in {spec['runtime']} {spec['precision']} ({spec['backend']})"
    if spec["impl"] in ("pipeline", "app", "bf16_check"):
        return f"{spec['impl']} ({spec['backend']})"
    name = f"{spec['impl']} ({spec['backend']}{', compile' if spec.get('compile') else ''})"
    notes = [spec["variant"]] if spec.get("variant") else []
    notes += ["no oneDNN"] if spec.get("onednn") is False else []
    return name + (f" [{', '.join(notes)}]" if notes else "")


def worker_name(spec):
    """The worker process that runs `spec`: one per backend, and one more for TensorFlow with its
    oneDNN kernels off (`onednn=False`), a setting that TensorFlow reads once, at import."""
    return spec["backend"] + ("-no-onednn" if spec.get("onednn") is False else "")
