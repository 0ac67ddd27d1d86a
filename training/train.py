"""Train or fine-tune a ViT with model.fit.

    python -m training.train --recipe fashion_mnist --out checkpoints/fashion-mnist-vit
    python -m training.train --recipe fine_tune --weights checkpoints/fashion-mnist-vit/model.keras \\
        --dataset fashion_mnist --image-size 56 --out runs/ft56
    python -m training.train --recipe fine_tune --weights ... --dataset /data/pets --val-split validation \\
        --test-split none    # a folder of class sub-folders

Every recipe field is a flag (`--learning-rate 3e-4`, `--no-flip`, `--val-split none`); the defaults
shown are the from_scratch recipe's, and another --recipe brings its own (training/recipes.py).
Running the same command again resumes a killed run; a re-run that changes the model or the data
is refused unless --overwrite (training/runs.py).

The backend is Keras' (KERAS_BACKEND=tensorflow, jax or torch). On a CPU (an AMD EPYC Zen 4, 2 cores),
ViT-S/16's train step ran at 0.92x to 1.02x timm's on all three in float32. Under --dtype-policy
mixed_bfloat16 torch was the fastest (0.99x timm's autocast), then TensorFlow (0.90x) and JAX (0.86x;
XLA:CPU runs two backward products of attention in float32): docs/performance.md.
"""

import argparse
import dataclasses
import types

from commands import cli, malloc, preflight
from training import best_epoch, distribute, ood_stats, recipes, runs

PROG = "python -m training.train"

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


def _field_help(field):
    """The field's help line with its from_scratch default and the recipes that change it."""
    others = [f"{name} {getattr(cls(), field.name)}" for name, cls in sorted(recipes.RECIPES.items())
              if getattr(cls(), field.name) != field.default]
    note = f"; {', '.join(others)}" if others else ""
    return f"{field.metadata['help']} (default: {field.default}{note})"


def build_parser():
    """The CLI's parser; it imports no deep-learning library, so --help works with any install."""
    parser = cli.parser(PROG, __doc__)
    parser.add_argument("--recipe", default="from_scratch", choices=sorted(recipes.RECIPES),
                        help="named recipe; its fields are the defaults of the flags below")
    parser.add_argument("--weights", help="checkpoint to start from: a .keras file, any keras_vit checkpoint, "
                        "a handle (hf://, gs://, https://) or a name of keras_vit.list_pretrained() (default: "
                        "none, a new model)")
    parser.add_argument("--out", default="runs/latest", help="output folder; rerun to resume")
    parser.add_argument("--overwrite", action="store_true", help="replace the run in --out, even one with another "
                        "model or data (without it such a re-run is refused)")
    parser.add_argument("--verbose", type=int, default=1, help="Keras fit verbosity (0 silent, 1 progress bars, "
                        "2 one line per epoch); 2 also shows the libraries' logs")
    malloc.add_argument(parser)
    for field in dataclasses.fields(recipes.Recipe):
        if field.name == "name":
            continue
        flag = "--" + field.name.replace("_", "-")
        base, parse = _parser_for(field)
        if base is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                                help=_field_help(field))
        else:
            parser.add_argument(flag, type=parse, default=argparse.SUPPRESS, metavar=base.__name__.upper(),
                                help=_field_help(field))
    distribute.add_arguments(parser)
    distribute.add_checkpoint_format(parser)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    # Checked before any deep-learning library loads: an error here takes well under a second.
    with cli.one_line_errors(PROG):
        preflight.require(PROG, preflight.TRAIN_MODULES)
        fields = {f.name for f in dataclasses.fields(recipes.Recipe)}
        given = {k: v for k, v in vars(args).items() if k in fields}
        recipe = recipes.get(args.recipe, **given)
        note = None
        if "test_split" not in given and recipe.test_split and preflight.is_folder(recipe.dataset):
            # A folder has splits train, validation and all (training.datasets.folder), never the
            # recipes' default "test": without --test-split a folder run evaluates nothing at the end.
            recipe = recipes.get(args.recipe, **given, test_split=None)
            note = ("note: a folder dataset has no test split, so this run has no final test evaluation "
                    "(--test-split validation evaluates the best model on the held-out images)")
        preflight.check_source(args.weights)
        recipes.check_lora(recipe, args.weights)
        recipes.check_naflex(recipe)
        ood = ood_stats.choice(recipe.ood_method, recipe.ood_blocks)
        preflight.check_dataset(recipe.dataset)
        plan = runs.plan(args.out, runs.configuration(recipe, args.weights), args.overwrite)
    if argv is None:  # the real command line: restart it with the allocator before Keras loads
        malloc.reexec(args.malloc, quiet=args.verbose < 2)
    if plan.message():
        print(plan.message(), flush=True)
    if note:
        print(note, flush=True)
    cli.quiet_logs(args.verbose >= 2)
    cli.import_tensorflow(args.verbose >= 2)  # tf.data is the input pipeline on every backend
    from training import loop

    with cli.one_line_errors(PROG, cli.USER_ERRORS + (loop.NaNLossError,), writing_to=args.out):
        metrics = loop.run(recipe, args.out, weights=args.weights, dist=distribute.from_args(args),
                           verbose=args.verbose, plan=plan, checkpoint_format=args.checkpoint_format, ood=ood)
    if metrics and metrics.get("kept"):
        print(best_epoch.line(metrics["kept"]))
    if metrics and "test_accuracy" in metrics:
        print(f"test accuracy {metrics['test_accuracy']:.4f} on {metrics['test_examples']} images; "
              f"reports in {args.out}")
    elif metrics is not None:
        print(f"trained; no test split, so no test accuracy; model and reports in {args.out}")


if __name__ == "__main__":
    main()
