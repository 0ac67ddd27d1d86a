"""Where the train step's time goes: forward, backward and optimizer, keras_vit (TF, XLA) against timm.

    python -m benchmarks.studies.train_breakdown [--reps 7] [--malloc auto]

The benchmark's small ViT (`benchmarks.cases.SMALL`, batch 128, AdamW) in one process with
KERAS_BACKEND=tensorflow, timm's model of the same size on torch beside it. For each library, three
functions are timed alternately (A B C, C B A, ...) after warm-up:
  forward            the training-mode forward pass and the loss;
  forward+backward   the same plus the gradients (TF: one XLA-compiled function with a GradientTape;
                     torch: `loss.backward()`);
  step               the whole step as `benchmarks.run` times it (`train_on_batch`; torch: backward
                     and `AdamW.step`).
Backward is (forward+backward) - forward, and the optimizer is step - (forward+backward). Medians
in seconds. The process restarts itself with the allocator of `--malloc`, as the benchmark workers do.
"""

import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from benchmarks import timing  # noqa: E402
from commands import cli, malloc  # noqa: E402


def _spec(backend):
    from benchmarks import cases

    return dict(backend=backend, impl="keras_vit", task="train", model=cases.SMALL, batch=128, dtype="float32")


def keras_phases():
    import keras
    import tensorflow as tf

    from benchmarks import impls, models

    spec = _spec("tensorflow")
    model = models.keras_model(spec)
    step = impls.keras_train_step(model, spec)  # compiles the model as benchmarks.run does
    loss_fn = keras.losses.CategoricalCrossentropy(from_logits=True)
    x, y = (tf.constant(a) for a in impls._data(spec))

    @tf.function(jit_compile=True)
    def forward(a, b):
        return loss_fn(b, model(a, training=True))

    @tf.function(jit_compile=True)
    def forward_backward(a, b):
        with tf.GradientTape() as tape:
            loss = loss_fn(b, model(a, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        return loss + tf.add_n([tf.reduce_sum(g) for g in grads]) * 0.0  # every gradient is computed

    return dict(forward=lambda: forward(x, y).numpy(), forward_backward=lambda: forward_backward(x, y).numpy(),
                step=step)


def timm_phases():
    import timm  # noqa: F401 - before benchmarks.models imports Keras (and TF): see main
    import torch

    from benchmarks import impls, models

    spec = _spec("torch")
    model = models.timm_model(spec["model"]).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    x, y = impls._data(spec)
    xt = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()  # (B, H, W, C) -> (B, C, H, W)
    labels = torch.from_numpy(y.argmax(-1))

    def forward():
        return torch.nn.functional.cross_entropy(model(xt), labels).item()

    def forward_backward():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(xt), labels)
        loss.backward()
        return loss.item()

    def step():
        loss = forward_backward()
        opt.step()
        return loss

    return dict(forward=forward, forward_backward=forward_backward, step=step)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=cli.HelpFormatter)
    parser.add_argument("--reps", type=int, default=7, help="timed repetitions per part (the median is kept)")
    malloc.add_argument(parser)
    args = parser.parse_args(argv)
    if argv is None:
        malloc.reexec(args.malloc)
    # timm first: under tcmalloc, triton (which timm's torchvision imports) aborts when it loads
    # after TensorFlow ("Attempt to free invalid pointer"); see commands/malloc.py.
    fns = {("timm (torch)", k): f for k, f in timm_phases().items()}
    fns |= {("keras_vit (tensorflow, XLA)", k): f for k, f in keras_phases().items()}
    med = timing.alternate(fns, args.reps, warmup=2)  # two warm-up calls: compilation, first-touch allocations
    print(f"median s over {args.reps} alternating repetitions (malloc: {malloc.in_use()})")
    print("| library | forward | backward | optimizer | step |")
    print("|---|---:|---:|---:|---:|")
    for lib in dict.fromkeys(k[0] for k in fns):
        f, fb, s = med[(lib, "forward")], med[(lib, "forward_backward")], med[(lib, "step")]
        print(f"| {lib} | {f:.3f} | {fb - f:.3f} | {s - fb:.3f} | {s:.3f} |")


if __name__ == "__main__":
    main()
