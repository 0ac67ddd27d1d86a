"""Evaluate a saved model on a dataset's test split, optionally at another resolution.

    python -m training.evaluate checkpoints/fashion-mnist-vit/model.keras --dataset fashion_mnist \
        --image-size 56     # position embeddings resampled by keras_vit.resize, no training
"""

import argparse

import keras_vit
from training import data, loop, reports


def evaluate(path, dataset, split="test", image_size=None, batch_size=250):
    """Top-1 accuracy of the model in `path` on `dataset`/`split`, resized to `image_size` if given."""
    model = loop.load_weights_file(path)
    if image_size and tuple(model.image_size) != (image_size, image_size):
        model = keras_vit.resize(model, image_size)
    raw, info = data.load(dataset, split)
    batches = data.pipeline(raw, info, model.image_size[0], model.image_mean, model.image_std, batch_size, False)
    labels, preds = reports.predict(model, batches)
    return float((labels == preds).mean())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("weights", help="a .keras file, any file keras_vit.load_checkpoint reads, a handle (hf://, gs://, https://) or a catalog name")
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--split", default="test")
    parser.add_argument("--image-size", type=int)
    args = parser.parse_args(argv)
    print(f"top-1 {evaluate(args.weights, args.dataset, args.split, args.image_size):.4f}")


if __name__ == "__main__":
    main()
