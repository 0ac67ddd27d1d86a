"""Train or fine-tune a ViT with model.fit.

    python -m training.train --recipe fashion_mnist --out checkpoints/fashion-mnist-vit
    python -m training.train --recipe fine_tune --weights checkpoints/fashion-mnist-vit/model.keras \
        --dataset fashion_mnist --image-size 56 --out runs/ft56

Every recipe field is a flag (`--learning-rate 3e-4`, `--no-flip`, `--val-split none`); see
`training/recipes.py`. Running the same command again resumes a killed run.
"""

import argparse
import dataclasses
import types

from training import malloc, recipes


def _parser_for(field):
    """argparse type for a recipe field: int, float, str, bool or an optional of one."""
    kind = field.type
    if isinstance(kind, str):  # postponed annotations
        kind = eval(kind, {}, {})  # noqa: S307 - only our own dataclass annotations, never user input
    args = getattr(kind, "__args__", None)
    base = next(a for a in args if a is not type(None)) if isinstance(kind, types.UnionType) else kind
    optional = isinstance(kind, types.UnionType)

    def parse(text):
        if optional and text.lower() == "none":
            return None
        return base(text)

    return base, parse


def build_parser():
    from training import distribute  # imports Keras: after the allocator restart in main

    parser = argparse.ArgumentParser(prog="python -m training.train", description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default="from_scratch", choices=sorted(recipes.RECIPES))
    parser.add_argument("--weights", help="checkpoint to start from: a .keras file, any file keras_vit.load_checkpoint reads, a handle (hf://, gs://, https://) or a name of keras_vit.list_pretrained()")
    parser.add_argument("--out", default="runs/latest", help="output folder; rerun to resume")
    parser.add_argument("--verbose", type=int, default=1, help="Keras fit verbosity (1: progress bars)")
    malloc.add_argument(parser)
    for field in dataclasses.fields(recipes.Recipe):
        if field.name == "name":
            continue
        flag = "--" + field.name.replace("_", "-")
        base, parse = _parser_for(field)
        if base is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS)
        else:
            parser.add_argument(flag, type=parse, default=argparse.SUPPRESS, metavar=base.__name__.upper())
    distribute.add_arguments(parser)
    return parser


def main(argv=None):
    if argv is None:  # the real command line: restart it with the allocator before Keras loads
        early = argparse.ArgumentParser(prog="python -m training.train", add_help=False)
        malloc.add_argument(early)
        malloc.reexec(early.parse_known_args()[0].malloc)
    args = build_parser().parse_args(argv)
    fields = {f.name for f in dataclasses.fields(recipes.Recipe)}
    overrides = {k: v for k, v in vars(args).items() if k in fields}
    recipe = recipes.get(args.recipe, **overrides)
    from training import distribute, loop

    metrics = loop.run(recipe, args.out, weights=args.weights, dist=distribute.from_args(args), verbose=args.verbose)
    if metrics:
        print(f"test accuracy {metrics['test_accuracy']:.4f} on {metrics['test_examples']} images; "
              f"reports in {args.out}")


if __name__ == "__main__":
    main()
