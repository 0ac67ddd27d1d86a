"""Training recipes: frozen dataclasses with names. Every field can be overridden from the CLI.

From scratch follows the paper's Appendix B.1 and AugReg (Steiner et al., 2022): AdamW, linear
warmup then cosine decay, weight decay, global-norm clipping at 1.0, dropout and stochastic depth,
label smoothing, light augmentation. Fine-tuning follows §3.2 and B.1.1: SGD with momentum 0.9,
warmup then cosine, clipping at 1.0, a new zero-initialized head, and a higher resolution with the
position embeddings resampled.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Every knob of a run; the named recipes below subclass it with their own defaults.

    `None` model fields come from the `model` preset.
    """

    name: str = "from_scratch"
    dataset: str = "cifar10"
    train_split: str | None = "train"  # None is refused: nothing to train on
    val_split: str | None = None  # held-out split for per-epoch validation and best-checkpoint choice
    test_split: str | None = "test"  # None: no final evaluation
    data_dir: str | None = None
    manual_dir: str | None = None
    # Model: a preset ("ViT-Ti/4") plus overrides.
    model: str = "ViT-Ti/4"
    image_size: int = 32
    hidden_dim: int | None = None
    num_layers: int | None = None
    num_heads: int | None = None
    mlp_dim: int | None = None
    pooling: str = "token"
    dropout_rate: float = 0.0
    drop_path_rate: float = 0.1
    # Optimization.
    optimizer: str = "adamw"  # "adamw" or "sgd"
    epochs: int = 30
    batch_size: int = 128
    learning_rate: float = 1e-3
    warmup_epochs: float = 2.0
    weight_decay: float = 0.05
    momentum: float = 0.9  # SGD only
    clipnorm: float = 1.0  # global-norm clipping
    label_smoothing: float = 0.1
    # Augmentation (Keras preprocessing layers, see training.datasets.pipeline).
    translate: float = 0.125  # random crop of a zero-padded image, as a fraction of the size
    flip: bool = True
    randaugment_layers: int = 0
    randaugment_magnitude: float = 0.5
    mixup: float = 0.0
    cutmix: float = 0.0
    # Fine-tuning: start from --weights, replace the head by a zero-initialized one.
    zero_head: bool = False
    # LoRA (Hu et al., 2021) on the attention's query and value projections of --weights: only the
    # low-rank factors and the head train (`ViT.enable_lora`). None: every weight trains.
    lora_rank: int | None = None
    # The out-of-domain score fit at the end of a run (training.ood_stats; None: keras_vit.ood's
    # DEFAULT_METHOD and DEFAULT_BLOCKS).
    ood_method: str | None = None
    ood_blocks: str | None = None
    seed: int = 0
    steps_per_epoch: int | None = None  # None: one pass over the training split
    strict_data: bool = False  # a folder dataset with unreadable images: refuse it rather than skip them
    jit_compile: bool = True
    # "auto": mixed_bfloat16 on a GPU or TPU, float32 on a CPU (`training.loop.dtype_policy`); the
    # CPU speeds of both on TF/XLA and JAX are the "infer ViT-S/16 224 b16" tables of
    # benchmarks/results/full.md. Or a Keras dtype policy: "float32", "mixed_bfloat16",
    # "mixed_float16" (loss scaling added by Keras).
    dtype_policy: str = "auto"


@dataclasses.dataclass(frozen=True)
class FromScratch(Recipe):
    """ViT-Ti/4 from scratch on CIFAR-10 at 32 px (paper B.1 / AugReg, scaled down).

        python -m training.train --recipe from_scratch --dataset cifar10 --out runs/cifar10

    Needs cifar10 prepared by tfds (or downloaded by it, where the machine has a network).
    """

    name: str = "from_scratch"
    randaugment_layers: int = 2
    mixup: float = 0.2


@dataclasses.dataclass(frozen=True)
class FashionMnist(Recipe):
    """The shipped checkpoint: a small ViT (D=64, 6 blocks, 4 heads, MLP 128, 4x4 patches on
    28x28, GAP pooling; 0.2M parameters) from scratch on the 60k Fashion-MNIST training images.

        KERAS_BACKEND=tensorflow python -m training.train --recipe fashion_mnist \\
            --out checkpoints/fashion-mnist-vit

    Its accuracy, training time and the translation study that chose `translate` are in
    docs/training.md ("The shipped Fashion-MNIST checkpoint").
    """

    name: str = "fashion_mnist"
    dataset: str = "fashion_mnist"
    model: str = "ViT-Ti/4"
    image_size: int = 28
    hidden_dim: int | None = 64
    num_layers: int | None = 6
    num_heads: int | None = 4
    mlp_dim: int | None = 128
    pooling: str = "gap"
    epochs: int = 30
    learning_rate: float = 3e-3
    warmup_epochs: float = 1.0
    drop_path_rate: float = 0.0
    translate: float = 0.05
    jit_compile: bool = False  # TF's own executor, not XLA: how the shipped checkpoint was trained


@dataclasses.dataclass(frozen=True)
class FineTune(Recipe):
    """Fine-tuning after §3.2 / B.1.1: SGD momentum 0.9, warmup then cosine, global clip 1.0, a new
    zero-initialized head, and usually a higher resolution (position embeddings resampled).

        KERAS_BACKEND=tensorflow python -m training.train --recipe fine_tune --dataset fashion_mnist \\
            --weights checkpoints/fashion-mnist-vit/model.keras --image-size 56 --out runs/fmnist-ft56

    What the command above gives on the shipped checkpoint is in docs/training.md ("Fine-tuning at twice
    the resolution").
    """

    name: str = "fine_tune"
    optimizer: str = "sgd"
    learning_rate: float = 0.01
    weight_decay: float = 0.0
    warmup_epochs: float = 0.5
    epochs: int = 3
    label_smoothing: float = 0.0
    drop_path_rate: float = 0.0
    translate: float = 0.0
    zero_head: bool = True


@dataclasses.dataclass(frozen=True)
class Shapes(Recipe):
    """The seed's tiny ViT (D=64, 2 blocks) on the seed's synthetic shapes, for quick checks and
    the tests; `training.experiments.data_scale` runs the seed's full experiment.

        python -m training.train --recipe shapes --out runs/shapes

    Its time and accuracy are in docs/training.md, below the table of recipes.
    """

    name: str = "shapes"
    dataset: str = "shapes"
    hidden_dim: int | None = 64
    num_layers: int | None = 2
    num_heads: int | None = 4
    mlp_dim: int | None = 128
    epochs: int = 2
    batch_size: int = 32
    learning_rate: float = 2e-3
    warmup_epochs: float = 0.1
    drop_path_rate: float = 0.0
    label_smoothing: float = 0.0
    translate: float = 0.0
    flip: bool = False


RECIPES = {cls.name: cls for cls in (FromScratch, FashionMnist, FineTune, Shapes)}


def check_lora(recipe, weights):
    """Raises ValueError for a `lora_rank` that is not a positive integer, or one without `weights`
    (LoRA adapts a trained model; on random weights only the factors would learn)."""
    rank = recipe.lora_rank
    if rank is None:
        return
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"lora_rank={rank!r} is not allowed; use a positive integer, or none to train every weight")
    if not weights:
        raise ValueError(f"lora_rank={rank} needs --weights: LoRA fine-tunes a trained model, and a new one has "
                         "nothing to adapt; drop --lora-rank to train from scratch")


def get(name, **overrides):
    """The recipe `name` with `overrides` applied; unknown names and fields are errors."""
    if name not in RECIPES:
        raise ValueError(f"Unknown recipe {name!r}; available recipes: {sorted(RECIPES)}")
    fields = {f.name for f in dataclasses.fields(Recipe)}
    bad = sorted(set(overrides) - fields)
    if bad:
        raise ValueError(f"Unknown recipe fields {bad}; available fields: {sorted(fields)}")
    return RECIPES[name](**overrides)
