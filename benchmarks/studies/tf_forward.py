"""keras_vit's forward pass on TensorFlow on a CPU, as it runs, against the same model with the two
parts that TensorFlow runs its own way there put back as Keras writes them.

    python -m benchmarks.studies.tf_forward [--preset ViT-S/16] [--batch 16] [--reps 6]

On TensorFlow on a CPU, keras_vit runs
- the attention core as one transpose of the packed Q, K, V and two batched `tf.matmul`s
  (`layers.attention_core`), where `ops.dot_product_attention` takes Q, K and V apart and its
  einsums copy each of them to another layout and back;
- the MLP's first layer as a 2-D `MatMul`, `BiasAdd` and GELU (`layers.dense.dense_then`), which
  TensorFlow's graph optimizer runs as one oneDNN kernel, where Keras' Dense forms a batched product
  and an `AddV2`.
Four forward functions are timed, for each precision (float32 and mixed_bfloat16) and with XLA
off (`tf.function`, the path Keras' `jit_compile="auto"` takes on a CPU) and on: as it runs
("keras_vit"), with `ops.dot_product_attention` ("Keras attention"), with fc1 called as a layer and
GELU after it ("Keras fc1"), and with both ("both Keras", the model before these changes). Each
function is traced with its parts in place, then all four are called in turn on the same batch
(`benchmarks.timing.alternate`); the table gives the median step and the speed against "both
Keras". Prints markdown.
"""

import argparse
import contextlib
import os

os.environ["KERAS_BACKEND"] = "tensorflow"

import numpy as np  # noqa: E402

from commands import cli  # noqa: E402

cli.quiet_logs()
tf = cli.import_tensorflow()  # without its import-time log lines

import keras  # noqa: E402

import keras_vit  # noqa: E402
from benchmarks import cases, models, timing  # noqa: E402
from benchmarks.cpu import cpu_info  # noqa: E402
from keras_vit.layers import attention, transformer  # noqa: E402


def keras_fc1(layer, x, activation):
    """fc1 called as a Keras layer, the activation after it."""
    return activation(layer(x))


VARIANTS = {  # name: {(module, attribute): replacement}
    "keras_vit": {},
    "Keras attention": {(attention, "attend"): models.keras_attend},
    "Keras fc1": {(transformer, "dense_then"): keras_fc1},
    "both Keras": {(attention, "attend"): models.keras_attend, (transformer, "dense_then"): keras_fc1},
}


@contextlib.contextmanager
def replaced(patches):
    """The module attributes of `patches` replaced for the block's duration."""
    saved = {key: getattr(*key) for key in patches}
    try:
        for (module, name), value in patches.items():
            setattr(module, name, value)
        yield
    finally:
        for (module, name), value in saved.items():
            setattr(module, name, value)


def forwards(model, x, xla):
    """{variant: () -> logits as numpy}, each traced (and called once) with its parts in place."""
    fns = {}
    for name, patches in VARIANTS.items():
        fn = tf.function(lambda t: model(t, training=False), jit_compile=xla)
        with replaced(patches):
            fn(x).numpy()  # traced here, with the variant's functions
        fns[name] = lambda fn=fn: fn(x).numpy()
    return fns


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=cli.HelpFormatter)
    parser.add_argument("--preset", default="ViT-S/16", help="the paper preset, at 224 px")
    parser.add_argument("--batch", type=int, default=16, help="images per step")
    parser.add_argument("--reps", type=int, default=6, help="timed calls of each variant, in turn")
    args = parser.parse_args(argv)
    preset = cases.preset(args.preset)
    size = preset["image_size"]
    x = tf.constant(np.random.default_rng(0).standard_normal((args.batch, size, size, 3), "float32"))
    info = cpu_info()
    print(f"{args.preset}, {size} px, batch {args.batch}, {info['model']} ({', '.join(info['key_flags'])}), "
          f"TensorFlow {tf.__version__}, Keras {keras.__version__}, load average {os.getloadavg()[0]:.1f}\n")
    print("| policy | XLA | variant | median s/step | img/s | vs both Keras |\n|---|---|---|---:|---:|---:|")
    for policy in ("float32", "mixed_bfloat16"):
        keras.mixed_precision.set_global_policy(policy)
        try:
            model = keras_vit.ViT(**preset)
        finally:
            keras.mixed_precision.set_global_policy("float32")
        for xla in (False, True):
            medians = timing.alternate(forwards(model, x, xla), args.reps)
            for name, s in medians.items():
                print(f"| {policy} | {'on' if xla else 'off'} | {name} | {s:.3f} | {args.batch / s:.1f} | "
                      f"{medians['both Keras'] / s:.2f}x |")
    print(f"\nLoad average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
