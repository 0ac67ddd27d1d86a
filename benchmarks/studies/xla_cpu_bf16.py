"""XLA:CPU's bf16 matrix products against torch's: the smallest reproduction of why bf16 gains nothing in JAX.

    python -m benchmarks.studies.xla_cpu_bf16 [--reps 20]

Two products of ViT-S/16 at 224 px, batch 16 (B 16, T 197, D 384, K 6 heads, Dh 64), in pure JAX
under `jax.jit` and in torch, timed in turn (A B C ..., then reversed) in one process:
  dense      (B T, D) x (D, 4 D), the MLP's first layer;
  attention  (B, K, T, Dh) x (B, K, T, Dh) -> (B, K, T, T), the attention's scores as 4-D products
             (`jax.nn.dot_product_attention`'s form);
  attention 3-D  (B K, T, Dh) x (B K, T, Dh) -> (B K, T, T), the same scores with batch and heads
             flattened into one axis (keras_vit.layers.attention_core's form);
  attention 3-D over T  (B K, T, T) x (B K, T, Dh) -> (B K, T, Dh), contracting the middle axis of both
             (the gradient of the values and of the keys in the attention's backward pass).
JAX runs each in float32, in bf16 with a bf16 result (what `jnp.matmul` of two bf16 arrays, and so
Keras' `mixed_bfloat16`, asks for), and in bf16 with a float32 result (`preferred_element_type`).
torch runs float32 and `torch.autocast(bfloat16)`. For each JAX variant it prints, from the optimized
HLO, the dtype of the product's operands as XLA:CPU runs it and the number of converts. Median ms, the
speed-up of bf16 over float32 (fp32 time / bf16 time), and JAX bf16 against torch bf16.
"""

import argparse
import os

import numpy as np

from benchmarks import timing
from benchmarks.cpu import cpu_info
from benchmarks import hlo as hlo_text
from commands import cli

B, T, D, K, DH = 16, 197, 384, 6, 64


def jax_ops():
    """{(op, variant): (fn, args)} of the jitted JAX products."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((B * T, D), "float32"), rng.standard_normal((D, 4 * D), "float32")
    q, k = (rng.standard_normal((B, K, T, DH), "float32") for _ in range(2))
    q3, k3 = (a.reshape(B * K, T, DH) for a in (q, k))
    p3 = rng.standard_normal((B * K, T, T), "float32")
    products = {
        "dense": (lambda a, b, out: jnp.matmul(a, b, preferred_element_type=out), (x, w)),  # (B T, D) x (D, 4D)
        # (B, K, T, Dh) x (B, K, S, Dh) -> (B, K, T, S)
        "attention": (lambda a, b, out: jnp.einsum("bkth,bksh->bkts", a, b, preferred_element_type=out), (q, k)),
        # (B K, T, Dh) x (B K, S, Dh) -> (B K, T, S)
        "attention 3-D": (lambda a, b, out: jnp.einsum("nth,nsh->nts", a, b, preferred_element_type=out), (q3, k3)),
        # (B K, T, S) x (B K, T, Dh) -> (B K, S, Dh)
        "attention 3-D over T": (lambda a, b, out: jnp.einsum("nts,nth->nsh", a, b, preferred_element_type=out),
                                 (p3, q3)),
    }
    variants = {"fp32": (jnp.float32, None), "bf16": (jnp.bfloat16, None), "bf16, f32 out": (jnp.bfloat16, jnp.float32)}
    out = {}
    for op, (fn, arrays) in products.items():
        for variant, (dtype, result) in variants.items():
            args = [jax.device_put(a).astype(dtype) for a in arrays]
            out[op, variant] = (jax.jit(lambda a, b, fn=fn, result=result: fn(a, b, result)), args)
    return out


def xla_view(fn, args):
    """(dtype of the product's first operand as XLA:CPU runs it, number of converts) from the optimized HLO."""
    hlo = hlo_text.parse_hlo(fn.lower(*args).compile().as_text())
    dots = [h for name, h in hlo.items() if name and h["opcode"] == "dot"]
    converts = sum(1 for name, h in hlo.items() if name and h["opcode"] == "convert")
    return hlo[dots[0]["operands"][0]]["dtype"], converts


def torch_ops():
    """{(op, variant): () -> tensor} of the same products in torch, float32 and autocast bf16."""
    import torch

    rng = np.random.default_rng(0)
    x, w = (torch.from_numpy(rng.standard_normal(s, "float32")) for s in ((B * T, D), (D, 4 * D)))
    q, k = (torch.from_numpy(rng.standard_normal((B, K, T, DH), "float32")) for _ in range(2))
    q3, k3 = (a.reshape(B * K, T, DH) for a in (q, k))
    p3 = torch.from_numpy(rng.standard_normal((B * K, T, T), "float32"))
    products = {"dense": lambda: x @ w, "attention": lambda: q @ k.transpose(-1, -2),  # -> (B, K, T, S)
                "attention 3-D": lambda: q3 @ k3.transpose(-1, -2),  # -> (B K, T, S)
                "attention 3-D over T": lambda: p3.transpose(-1, -2) @ q3}  # -> (B K, S, Dh)

    def run(product, bf16):
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            return product()

    return {(op, v): (lambda p=p, bf16=v == "bf16": run(p, bf16))
            for op, p in products.items() for v in ("fp32", "bf16")}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=cli.HelpFormatter)
    parser.add_argument("--reps", type=int, default=20, help="timed calls of each product")
    args = parser.parse_args(argv)
    import jax
    import torch

    cpu, load = cpu_info(), os.getloadavg()[0]
    jops, tops = jax_ops(), torch_ops()
    fns = {("jax", *key): (lambda f=f, a=a: f(*a).block_until_ready()) for key, (f, a) in jops.items()}
    fns.update({("torch", *key): f for key, f in tops.items()})
    ms = {key: 1e3 * s for key, s in timing.alternate(fns, args.reps, warmup=2).items()}
    print(f"{cpu['model']}, {cpu['cores']} CPUs, flags {' '.join(cpu['key_flags'])}; jax {jax.__version__}, "
          f"torch {torch.__version__} ({torch.get_num_threads()} threads); load average {load:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after; median of {args.reps} calls each\n")
    print("| product | variant | XLA runs the product in | converts | ms | bf16 speed-up | vs torch bf16 |")
    print("|---|---|---|---:|---:|---:|---:|")
    for op in ("dense", "attention", "attention 3-D", "attention 3-D over T"):
        for variant in ("fp32", "bf16", "bf16, f32 out"):
            dtype, converts = xla_view(*jops[op, variant])
            t = ms["jax", op, variant]
            gain = "" if variant == "fp32" else f"{ms['jax', op, 'fp32'] / t:.2f}x"
            vs = "" if variant == "fp32" else f"{ms['torch', op, 'bf16'] / t:.2f}x"
            print(f"| {op} | JAX {variant} | {dtype} | {converts} | {t:.1f} | {gain} | {vs} |")
        for variant in ("fp32", "bf16"):
            t = ms["torch", op, variant]
            gain = "" if variant == "fp32" else f"{ms['torch', op, 'fp32'] / t:.2f}x"
            print(f"| {op} | torch {variant}{' autocast' if variant == 'bf16' else ''} | | | {t:.1f} | {gain} | |")


if __name__ == "__main__":
    main()
