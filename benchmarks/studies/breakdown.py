"""Where the fp32 ViT-S/16 forward pass spends its time on a CPU: matrix products or the rest.

    KERAS_BACKEND=tensorflow python -m benchmarks.studies.breakdown [--reps 7]

Three XLA-compiled TensorFlow functions are timed in turn (A B C C B A ...), batch 16 at 224 px:
- "model": keras_vit's ViT-S/16 forward pass, as `benchmarks.run` times it;
- "matmuls": only the model's matrix products, with its shapes: the patch projection, per block
  the q, k, v and output projections, QK^T and AV, fc1 and fc2, chained so that none is skipped;
- "peak": a 2048 x 2048 product, the reference that `benchmarks.run` calls the matmul peak.
The gap between "model" and "matmuls" is the time of everything else (LayerNorm, GELU, softmax,
bias adds, residual adds, layout copies); the gap between the matmuls' GFLOP/s and the peak is
what these smaller products lose to the big square one. This is a decomposition, not a profiler
trace: it needs nothing but TensorFlow, and its figures come with the run's own peak.

Shapes: B batch 16, T tokens 197, D width 384, K heads 6, Dh 64, M MLP width 1536, L 12 blocks.
"""

import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402

from commands import cli  # noqa: E402

cli.quiet_logs()
tf = cli.import_tensorflow()  # without its import-time log lines

import keras_vit  # noqa: E402
from benchmarks import timing  # noqa: E402

B, IMAGE, P = 16, 224, 16


def model_fn():
    model = keras_vit.ViT.from_preset("ViT-S/16", num_classes=1000)
    return tf.function(lambda x: model(x, training=False), jit_compile=True), model


def matmul_fn(model):
    d, k, m, layers = model.hidden_dim, model.num_heads, model.mlp_dim, model.num_layers
    n = (IMAGE // P) ** 2
    t, dh = n + 1, d // k
    rng = np.random.default_rng(0)

    def w(*shape):
        return tf.constant(rng.normal(0, 0.02, shape).astype("float32"))

    patch = w(P * P * 3, d)
    qkv_o = [w(d, d) for _ in range(4)]
    fc1, fc2 = w(d, m), w(m, d)

    @tf.function(jit_compile=True)
    def run(pixels):  # pixels: (B * N, P * P * 3)
        x = tf.matmul(pixels, patch)  # (B N, P P 3) x (P P 3, D)
        x = tf.reshape(tf.pad(tf.reshape(x, (B, n, d)), [[0, 0], [1, 0], [0, 0]]), (B * t, d))  # (B T, D)
        for _ in range(layers):
            q, kk, v = (tf.matmul(x, qkv_o[i]) for i in range(3))  # 3 x (B T, D) x (D, D)

            def heads(z):  # (B T, D) -> (B K, T, Dh)
                return tf.reshape(tf.transpose(tf.reshape(z, (B, t, k, dh)), (0, 2, 1, 3)), (B * k, t, dh))

            scores = tf.matmul(heads(q), heads(kk), transpose_b=True)  # (B K, T, T)
            att = tf.matmul(scores, heads(v))  # (B K, T, Dh)
            att = tf.reshape(tf.transpose(tf.reshape(att, (B, k, t, dh)), (0, 2, 1, 3)), (B * t, d))
            x = tf.matmul(att, qkv_o[3])  # (B T, D) x (D, D)
            x = tf.matmul(tf.matmul(x, fc1), fc2)  # (B T, D) x (D, M) x (M, D)
        return tf.reduce_sum(x)

    flops = 2 * B * (n * P * P * 3 * d + layers * t * (4 * d * d + 2 * t * d + 2 * d * m))
    return run, flops


def peak_fn():
    a = tf.constant(np.random.default_rng(1).normal(size=(2048, 2048)).astype("float32"))
    return tf.function(lambda: tf.reduce_sum(tf.matmul(a, a)), jit_compile=True), 2 * 2048**3


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=cli.HelpFormatter)
    parser.add_argument("--reps", type=int, default=7, help="timed repetitions per measurement (the median is kept)")
    args = parser.parse_args(argv)
    model_call, model = model_fn()
    matmuls, matmul_flops = matmul_fn(model)
    peak, peak_flops = peak_fn()
    images = tf.constant(np.random.default_rng(2).normal(size=(B, IMAGE, IMAGE, 3)).astype("float32"))
    pixels = tf.constant(np.random.default_rng(3).normal(size=(B * (IMAGE // P) ** 2, P * P * 3)).astype("float32"))
    model_flops = 2 * keras_vit.model_macs(model)["total"] * B
    cases = {
        "model": (lambda: model_call(images), model_flops),
        "matmuls": (lambda: matmuls(pixels), matmul_flops),
        "peak": (peak, peak_flops),
    }
    # Two untimed calls each: compilation and first-touch allocations. np.asarray waits for the result.
    calls = {name: (lambda fn=fn: np.asarray(fn())) for name, (fn, _) in cases.items()}
    median = timing.alternate(calls, args.reps, warmup=2)
    peak_rate = peak_flops / median["peak"] / 1e9
    print(f"1-minute load average at the end: {os.getloadavg()[0]:.1f}; {args.reps} alternating repetitions, medians")
    print("| function | median s | GFLOP | GFLOP/s | % of peak |")
    print("|---|---:|---:|---:|---:|")
    for name, (_, flops) in cases.items():
        rate = flops / median[name] / 1e9
        print(f"| {name} | {median[name]:.4f} | {flops / 1e9:.1f} | {rate:.0f} | {100 * rate / peak_rate:.0f}% |")
    rest = median["model"] - median["matmuls"]
    print(f"\nmatrix products: {median['matmuls']:.3f} s of the model's {median['model']:.3f} s "
          f"({100 * median['matmuls'] / median['model']:.0f}%); everything else {rest:.3f} s "
          f"({100 * rest / median['model']:.0f}%)")


if __name__ == "__main__":
    main()
