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
    """Every knob of a run. `None` model fields come from the `model` preset."""

    name: str = "from_scratch"
    dataset: str = "cifar10"
    train_split: str = "train"
    val_split: str | None = None  # held-out split for per-epoch validation and best-checkpoint choice
    test_split: str = "test"
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
    # Augmentation (Keras preprocessing layers, see training.data).
    translate: float = 0.125  # random crop of a zero-padded image, as a fraction of the size
    flip: bool = True
    randaugment_layers: int = 0
    randaugment_magnitude: float = 0.5
    mixup: float = 0.0
    cutmix: float = 0.0
    # Fine-tuning: start from --weights, replace the head by a zero-initialized one.
    zero_head: bool = False
    seed: int = 0
    steps_per_epoch: int | None = None  # None: one pass over the training split
    jit_compile: bool = True


FASHION_MNIST = Recipe(
    name="fashion_mnist",
    dataset="fashion_mnist",
    model="ViT-Ti/4",
    image_size=28,
    hidden_dim=64,
    num_layers=6,
    num_heads=4,
    mlp_dim=128,
    pooling="gap",
    epochs=10,
    batch_size=128,
    learning_rate=2e-3,
    warmup_epochs=1.0,
    drop_path_rate=0.0,
    translate=0.1,
)
FASHION_MNIST_DOC = """Small ViT (D=64, 6 blocks, 4 heads, 4x4 patches, GAP) from scratch on Fashion-MNIST.

    python -m training.train --recipe fashion_mnist --out checkpoints/fashion-mnist-vit
"""

FINE_TUNE = Recipe(
    name="fine_tune",
    optimizer="sgd",
    learning_rate=0.01,
    momentum=0.9,
    weight_decay=0.0,
    warmup_epochs=0.5,
    epochs=3,
    batch_size=128,
    label_smoothing=0.0,
    drop_path_rate=0.0,
    translate=0.0,
    flip=True,
    zero_head=True,
)

FROM_SCRATCH = Recipe()

SHAPES = Recipe(
    name="shapes",
    dataset="shapes",
    model="ViT-Ti/4",
    image_size=32,
    hidden_dim=64,
    num_layers=2,
    num_heads=4,
    mlp_dim=128,
    epochs=2,
    batch_size=32,
    learning_rate=2e-3,
    warmup_epochs=0.1,
    drop_path_rate=0.0,
    label_smoothing=0.0,
    translate=0.0,
    flip=False,
)

RECIPES = {r.name: r for r in (FROM_SCRATCH, FASHION_MNIST, FINE_TUNE, SHAPES)}


def get(name, **overrides):
    """The recipe `name` with `overrides` applied; unknown names and fields are errors."""
    if name not in RECIPES:
        raise ValueError(f"Unknown recipe {name!r}; available recipes: {sorted(RECIPES)}")
    fields = {f.name for f in dataclasses.fields(Recipe)}
    bad = sorted(set(overrides) - fields)
    if bad:
        raise ValueError(f"Unknown recipe fields {bad}; available fields: {sorted(fields)}")
    return dataclasses.replace(RECIPES[name], **overrides)
