"""Training recipes: frozen dataclasses with names. Every field can be overridden from the CLI.

From scratch follows the paper's Appendix B.1 and AugReg (Steiner et al., 2022): AdamW, linear
warmup then cosine decay, weight decay, global-norm clipping at 1.0, dropout and stochastic depth,
label smoothing, light augmentation. Fine-tuning follows §3.2 and B.1.1: SGD with momentum 0.9,
warmup then cosine, clipping at 1.0, a new zero-initialized head, and a higher resolution with the
position embeddings resampled.
"""

import dataclasses


def knob(default, text):
    """A recipe field with its --help line (`training.train` adds the defaults of each recipe)."""
    return dataclasses.field(default=default, metadata={"help": text})


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Every knob of a run; the named recipes below subclass it with their own defaults.

    `None` model fields come from the `model` preset.
    """

    name: str = "from_scratch"
    dataset: str = knob("cifar10", "tfds name, 'fashion_mnist', 'shapes', or a folder of class sub-folders")
    train_split: str | None = knob("train", "split to train on")  # None is refused: nothing to train on
    val_split: str | None = knob(
        None, "held-out split for per-epoch validation and the best checkpoint ('none': keep the last)")
    test_split: str | None = knob("test", "split for the final evaluation ('none': no test evaluation)")
    data_dir: str | None = knob(None, "tfds data folder ('none': tfds' default)")
    manual_dir: str | None = knob(None, "folder with manually downloaded tfds files ('none': tfds' default)")
    # Model: a preset ("ViT-Ti/4") plus overrides.
    model: str = knob("ViT-Ti/4", "preset, e.g. ViT-Ti/4 or ViT-B/16; the model flags below override it")
    image_size: int = knob(32, "input side in pixels, a multiple of the patch size")
    hidden_dim: int | None = knob(None, "width D ('none': the preset's)")
    num_layers: int | None = knob(None, "encoder blocks L ('none': the preset's)")
    num_heads: int | None = knob(None, "attention heads ('none': the preset's)")
    mlp_dim: int | None = knob(None, "MLP width ('none': the preset's)")
    pooling: str = knob("token", "'token' (class token) or 'gap' (global average pooling)")
    dropout_rate: float = knob(0.0, "dropout after the embeddings and in the MLPs")
    drop_path_rate: float = knob(0.1, "stochastic depth of the last block (linear over depth)")
    # Optimization.
    optimizer: str = knob("adamw", "'adamw' or 'sgd'")
    epochs: int = knob(30, "training epochs")
    batch_size: int = knob(128, "global batch size")
    learning_rate: float = knob(1e-3, "peak learning rate, after warmup")
    warmup_epochs: float = knob(2.0, "linear warmup, in epochs (then cosine decay)")
    weight_decay: float = knob(0.05, "decoupled weight decay (none on biases, norms, tokens, embeddings)")
    momentum: float = knob(0.9, "SGD momentum")
    clipnorm: float = knob(1.0, "global-norm gradient clipping")
    label_smoothing: float = knob(0.1, "label smoothing of the cross-entropy")
    # Augmentation (Keras preprocessing layers, see training.datasets.pipeline).
    # A random crop of the zero-padded image.
    translate: float = knob(0.125, "random translation, as a fraction of the image size")
    flip: bool = knob(True, "random horizontal flips")
    randaugment_layers: int = knob(0, "RandAugment operations per image (0: off)")
    randaugment_magnitude: float = knob(0.5, "RandAugment strength, 0..1")
    mixup: float = knob(0.0, "MixUp alpha (0: off)")
    cutmix: float = knob(0.0, "CutMix factor (0: off)")
    # NaFlex (training.datasets.naflex): each image at its own aspect ratio, as a patch sequence.
    naflex: bool = knob(False, "train on patch sequences, each image at its own aspect ratio under a token "
                        "budget (docs/naflex.md)")
    max_seq_len: int | None = knob(None, "with --naflex, the token budget of evaluation and serving ('none': "
                                   "the square model's (image-size / patch size)^2)")
    seq_lens: str | None = knob(None, "with --naflex, the training budgets, one drawn per image, e.g. '48,64', "
                                "each batch holding batch-size * max-seq-len tokens ('none': max-seq-len alone)")
    # Fine-tuning: start from --weights, replace the head by a zero-initialized one.
    zero_head: bool = knob(False, "replace the head of --weights by a zero-initialized one")
    # LoRA (Hu et al., 2021) on the attention's query and value projections of --weights: only the
    # low-rank factors and the head train (`ViT.enable_lora`). None: every weight trains.
    lora_rank: int | None = knob(
        None, "train only LoRA factors of this rank on query and value, and the head ('none': every weight)")
    # The out-of-domain score fit at the end of a run (training.ood_stats; None: keras_vit.ood's
    # DEFAULT_METHOD and DEFAULT_BLOCKS).
    ood_method: str | None = knob(
        None, "out-of-domain score fit at the end: msp, energy, mahalanobis, rmds, vim or knn ('none': the default)")
    ood_blocks: str | None = knob(
        None, "its features: 'pooled', 'all' blocks or indices such as '4,5' ('none': the default)")
    seed: int = knob(0, "seed of the split, shuffle, augmentation and initialization")
    steps_per_epoch: int | None = knob(None, "steps per epoch ('none': one pass over the training split)")
    strict_data: bool = knob(False, "refuse a folder dataset with unreadable images instead of skipping them")
    jit_compile: bool = knob(True, "XLA-compile the train step (TensorFlow, JAX)")
    # "auto": mixed_bfloat16 on a GPU or TPU, float32 on a CPU (`training.loop.dtype_policy`); the
    # CPU speeds of both, per backend, are in docs/performance.md ("TensorFlow's executor and torch:
    # the attention core, fc1, the bias and the switched-off parts"). Or a Keras dtype policy:
    # "float32", "mixed_bfloat16", "mixed_float16" (loss scaling added by Keras).
    dtype_policy: str = knob(
        "auto", "'auto' (bfloat16 on a GPU or TPU, float32 on a CPU), 'float32', 'mixed_bfloat16' (on a CPU "
        "with avx512_bf16 or amx_bf16, ViT-S/16 trained 1.5-1.8x faster than in float32 on JAX, torch, or "
        "TensorFlow without XLA: docs/performance.md) or 'mixed_float16'")


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
    the tests; `experiments.data_scale` runs the seed's full experiment.

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


# Augmentations of whole batches of one image size, which patch sequences cannot take.
BATCH_AUGMENTATIONS = ("randaugment_layers", "mixup", "cutmix")


def parse_seq_lens(text, max_seq_len):
    """The training budgets of the text "64,100,144" (None: `max_seq_len` alone), sorted; raises a
    one-line ValueError for anything but positive ints."""
    if text is None:
        return (max_seq_len,)
    try:
        budgets = sorted({int(v) for v in str(text).split(",") if v.strip()})
    except ValueError:
        budgets = []
    if not budgets or budgets[0] < 1:
        raise ValueError(f"seq_lens={text!r} is not allowed; use token budgets of at least one patch, e.g. '48,64'")
    return tuple(budgets)


def check_naflex(recipe):
    """Raises a one-line ValueError for NaFlex options that the recipe cannot take (see
    `training.datasets.naflex`); loads no library."""
    if not recipe.naflex:
        if recipe.max_seq_len is not None or recipe.seq_lens is not None:
            raise ValueError("max_seq_len and seq_lens are the token budgets of patch sequences; add --naflex")
        return
    if recipe.max_seq_len is not None and (isinstance(recipe.max_seq_len, bool) or recipe.max_seq_len < 1):
        raise ValueError(f"max_seq_len={recipe.max_seq_len!r} is smaller than one patch; the token budget is a "
                         "number of patches, an int >= 1")
    parse_seq_lens(recipe.seq_lens, recipe.max_seq_len or 1)
    used = [f"--{k.replace('_', '-')} {getattr(recipe, k)}" for k in BATCH_AUGMENTATIONS if getattr(recipe, k)]
    if used:
        raise ValueError(f"{', '.join(used)} work on batches of one image size, and --naflex batches sequences of "
                         "many sizes; set them to 0 (--flip and --translate apply to each image)")


def get(name, **overrides):
    """The recipe `name` with `overrides` applied; unknown names and fields are errors."""
    if name not in RECIPES:
        raise ValueError(f"Unknown recipe {name!r}; available recipes: {sorted(RECIPES)}")
    fields = {f.name for f in dataclasses.fields(Recipe)}
    bad = sorted(set(overrides) - fields)
    if bad:
        raise ValueError(f"Unknown recipe fields {bad}; available fields: {sorted(fields)}")
    return RECIPES[name](**overrides)
