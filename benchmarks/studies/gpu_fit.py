"""A short `model.fit` of the fashion_mnist recipe's model, for a GPU image without TensorFlow.

    KERAS_BACKEND=jax python -m benchmarks.studies.gpu_fit [--epochs 3] [--dtype mixed_bfloat16]

The recipe (`training.recipes.FashionMnist`) trains through `tf.data`; a GPU image that has JAX and
torch but not TensorFlow cannot run `python -m training.train`. This fits the same model (its
architecture, AdamW with warmup and cosine decay, learning rate, weight decay, batch size) on the
Fashion-MNIST arrays from `keras.datasets` (looked up under KERAS_HOME; scripts/gpu-wheels puts
Debian's files there), without augmentation, and prints each epoch's training time, images/s and the
test accuracy; the first epoch's time includes the compilation. It is a smoke run of `model.fit` on
the device, not the recipe's accuracy figure.
"""

import argparse
import time

import keras

import keras_vit
from commands import cli
from training import recipes


class EpochTimes(keras.callbacks.Callback):
    """Each epoch's training seconds (its first includes the compilation), without its validation."""

    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.perf_counter()

    def on_test_begin(self, logs=None):
        self.seconds = time.perf_counter() - self.start

    def on_epoch_end(self, epoch, logs=None):
        logs["seconds"] = self.seconds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=cli.HelpFormatter)
    parser.add_argument("--epochs", type=int, default=3, help="epochs to fit")
    parser.add_argument("--dtype", default="float32", choices=["float32", "mixed_bfloat16"], help="dtype policy")
    parser.add_argument("--train-images", type=int, default=60000, help="the first N training images")
    args = parser.parse_args(argv)
    recipe = recipes.FashionMnist()
    (x_train, y_train), (x_test, y_test) = keras.datasets.fashion_mnist.load_data()
    x_train, y_train = x_train[:args.train_images], y_train[:args.train_images]
    config = dict(keras_vit.preset_config(recipe.model), hidden_dim=recipe.hidden_dim, num_layers=recipe.num_layers,
                  num_heads=recipe.num_heads, mlp_dim=recipe.mlp_dim)
    model = keras_vit.ViT(**config, image_size=recipe.image_size, num_channels=1, num_classes=10,
                          pooling=recipe.pooling, dtype=args.dtype)
    # The model's own normalization (its default mean and std, 0.5: pixels to [-1, 1]), enough for a
    # smoke run; the recipe's runs use the dataset's statistics.
    x_train, x_test = (keras.ops.convert_to_numpy(model.preprocessing.normalize(x[..., None]))
                       for x in (x_train, x_test))  # (N, 28, 28) -> (N, 28, 28, 1)
    steps = args.epochs * (len(x_train) // recipe.batch_size)
    schedule = keras.optimizers.schedules.CosineDecay(
        0.0, max(steps - len(x_train) // recipe.batch_size, 1), warmup_target=recipe.learning_rate,
        warmup_steps=int(recipe.warmup_epochs * len(x_train) // recipe.batch_size))
    model.compile(optimizer=keras.optimizers.AdamW(schedule, weight_decay=recipe.weight_decay),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    history = model.fit(x_train, y_train, batch_size=recipe.batch_size, epochs=args.epochs, verbose=2,
                        validation_data=(x_test, y_test), callbacks=[EpochTimes()])
    print(f"device {keras.backend.backend()} {args.dtype}, batch {recipe.batch_size}")
    for epoch, (seconds, acc) in enumerate(zip(history.history["seconds"], history.history["val_accuracy"]), 1):
        print(f"epoch {epoch}: {seconds:.1f} s, {len(x_train) / seconds:.0f} img/s, test accuracy {acc:.4f}")


if __name__ == "__main__":
    main()
