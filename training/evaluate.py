"""Evaluate a saved model on a dataset's test split, optionally at another resolution.

    python -m training.evaluate checkpoints/fashion-mnist-vit/model.keras --dataset fashion_mnist \\
        --image-size 56     # position embeddings resampled by keras_vit.resize, no training
"""

from commands import cli, preflight

PROG = "python -m training.evaluate"


def evaluate(path, dataset, split="test", image_size=None, batch_size=250, strict=False):
    """Top-1 accuracy of the model in `path` on `dataset`/`split`, resized to `image_size` if given."""
    import keras_vit
    from training import datasets, loop, reports

    model = loop.load_weights_file(path)
    if image_size and tuple(model.image_size) != (image_size, image_size):
        model = keras_vit.resize(model, image_size)
    raw, info = datasets.load(dataset, split, strict=strict)
    batches = datasets.pipeline(raw, info, model.image_size[0], model.image_mean, model.image_std, batch_size, False)
    labels, preds = reports.predict(model, batches)
    return float((labels == preds).mean())


def main(argv=None):
    parser = cli.parser(PROG, __doc__)
    parser.add_argument("weights", help="the model: a .keras file, any keras_vit checkpoint, a handle "
                        "(hf://, gs://, https://) or a name of keras_vit.list_pretrained()")
    parser.add_argument("--dataset", required=True, help="tfds name, 'fashion_mnist', 'shapes' or a folder of "
                        "class sub-folders")
    parser.add_argument("--split", default="test", help="split to evaluate on")
    parser.add_argument("--image-size", type=int, help="resize the model to this side first (default: its own)")
    parser.add_argument("--batch-size", type=int, default=250, help="evaluation batch size")
    parser.add_argument("--strict-data", action="store_true", help="refuse a folder with unreadable images "
                        "instead of skipping them")
    parser.add_argument("--verbose", action="store_true", help="show the libraries' logs")
    args = parser.parse_args(argv)
    preflight.start(PROG, args.weights, args.dataset, verbose=args.verbose)  # bad paths fail before TensorFlow loads
    with cli.one_line_errors(PROG):
        accuracy = evaluate(args.weights, args.dataset, args.split, args.image_size, args.batch_size, args.strict_data)
    print(f"top-1 {accuracy:.4f}")


if __name__ == "__main__":
    main()
