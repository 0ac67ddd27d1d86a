"""Which kernel runs `keras_vit.layers.Attention`'s core on a GPU: cuDNN's fused attention or flash
attention, or XLA's / torch's plain products.

    KERAS_BACKEND=jax python -m benchmarks.studies.gpu_attention
    KERAS_BACKEND=torch python -m benchmarks.studies.gpu_attention

The layer calls `ops.dot_product_attention` with no `flash_attention` argument, so Keras picks the
kernel. At ViT-S/16 shapes (B 16, T 197 tokens, 6 heads of 64), in float32 and bfloat16, forward
and backward, this prints the kernels that ran: on JAX the custom calls of the compiled HLO
(cuDNN's is `__cudnn$fmha...`), on torch the CUDA kernels that `torch.profiler` saw whose names
speak of attention (flash, efficient/mem-eff, cudnn, fmha, softmax). Run on a CPU, it prints that
no GPU is visible and exits with 2.
"""

import argparse
import re
import sys

import keras
import numpy as np

from commands import cli
from keras_vit.layers import Attention

B, T, K, DH = 16, 197, 6, 64


def layer_and_input(dtype):
    layer = Attention(num_heads=K, key_dim=DH, dtype=dtype)
    x = keras.ops.convert_to_tensor(np.random.default_rng(0).standard_normal((B, T, K * DH), "float32"))
    layer(x)
    return layer, x


def jax_kernels(dtype):
    import jax

    layer, x = layer_and_input(dtype)
    tv = [v.value for v in layer.trainable_variables]

    def loss(tv, x):
        out, _ = layer.stateless_call(tv, [], x)
        return keras.ops.sum(keras.ops.cast(out, "float32"))

    text = jax.jit(jax.value_and_grad(loss)).lower(tv, x).compile().as_text()
    return sorted(set(re.findall(r'custom_call_target="([^"]+)"', text)))


def torch_kernels(dtype):
    import torch

    layer, x = layer_and_input(dtype)
    x = x.detach().requires_grad_(True)
    for _ in range(2):  # the first call may pick and tune kernels
        layer(x).float().sum().backward()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        layer(x).float().sum().backward()
        torch.cuda.synchronize()
    names = {e.key for e in prof.key_averages()}
    return sorted(n for n in names if re.search(r"flash|efficient|mem_eff|cudnn|fmha|softmax|attention", n, re.I))


def main(argv=None):
    argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=cli.HelpFormatter).parse_args(argv)
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        has_gpu = jax.devices()[0].platform == "gpu"
    elif backend == "torch":
        import torch

        has_gpu = torch.cuda.is_available()
    else:
        sys.exit(f"KERAS_BACKEND={backend!r}: this check runs on 'jax' or 'torch'")
    if not has_gpu:
        print(f"no GPU visible to {backend}: nothing to check")
        sys.exit(2)
    for dtype in ("float32", "mixed_bfloat16"):
        kernels = (jax_kernels if backend == "jax" else torch_kernels)(dtype)
        print(f"{backend} {dtype}: {', '.join(kernels) or 'no custom call or attention kernel'}")


if __name__ == "__main__":
    main()
