"""Per-device memory of ViT training under `keras.distribution.ModelParallel`, from the config.

    python -m training.memory            # prints the per-device memory table of docs/distributed.md

An estimate computed from shapes, not a measurement. With a (b, m) mesh ("batch", "model") and
`keras_vit.distribution.RULES`, each device holds:

- weights: the replicated variables (embeddings, LayerNorms, output and fc2 biases, head) in
  full, and 1/m of q, k, v, the attention output kernel, fc1 and fc2;
- gradients: the same as the weights;
- AdamW state: two moments per weight (Keras' AdamW keeps m and v in the variable dtype);
- activations kept for the backward pass, per sample and block, in elements (T tokens):
  LN1 input and output, LN2 input and output: 4 T D (replicated);
  q, k, v and the attention context: 4 T D / m; fc1 output and GELU output: 2 T M / m;
  attention probabilities K T^2 / m (a fused flash-attention kernel does not keep them: the
  "activations" column then shrinks by that term). Times per-device batch and depth.
  This is what plain autodiff keeps, without rematerialization (which trades it for compute).
"""

import argparse
import dataclasses

from keras_vit.cost import count_params
from keras_vit.models.presets import preset_config

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    config: dict
    image_size: int
    mesh: tuple  # (b, m): data-parallel rows, model-parallel width
    batch_per_device: int  # samples per device row, i.e. global batch / b


def vit_22b_sized():
    """A ViT-22B-sized config of this architecture (Dehghani et al., 2023, Table 1 sizes:
    48 layers, width 6144, MLP 24576, 48 heads, patch 14; GAP pooling, no class token)."""
    return dict(hidden_dim=6144, num_layers=48, num_heads=48, mlp_dim=24576, patch_size=14, pooling="gap")


def parameter_counts(config, num_classes=1000, num_channels=3, image_size=224):
    """(sharded, replicated) parameter counts: sharded ones are split over the model axis."""
    d, m = config["hidden_dim"], config["mlp_dim"]
    sharded_block = 4 * d * d + 3 * d + 2 * d * m + m  # q, k, v (+ biases), out kernel, fc1 (+ bias), fc2
    total = count_params(dict(config, num_classes=num_classes, num_channels=num_channels, image_size=image_size))
    return config["num_layers"] * sharded_block, total - config["num_layers"] * sharded_block


def num_tokens(config, image_size=224):
    prefix = 1 if config.get("pooling", "token") == "token" else 0
    return prefix + (image_size // config["patch_size"]) ** 2


def activation_elements(config, tokens, model_axis):
    """Elements kept for backward per sample, over all blocks (see the module docstring)."""
    d, m, k = config["hidden_dim"], config["mlp_dim"], config["num_heads"]
    per_block = 4 * tokens * d + (4 * tokens * d + 2 * tokens * m + k * tokens * tokens) / model_axis
    return config["num_layers"] * per_block


def per_device_gib(row, weight_bytes=4, activation_bytes=2):
    """Weights, gradients, AdamW state and activations on one device, in GiB."""
    batch_rows, model_axis = row.mesh
    for what, size in (("num_heads", row.config["num_heads"]), ("mlp_dim", row.config["mlp_dim"])):
        if size % model_axis:
            raise ValueError(f"{row.name}: {what}={size} is not divisible by the model axis {model_axis}")
    sharded, replicated = parameter_counts(row.config, image_size=row.image_size)
    params = sharded / model_axis + replicated
    tokens = num_tokens(row.config, row.image_size)
    weights = params * weight_bytes / GIB
    activations = activation_elements(row.config, tokens, model_axis) * row.batch_per_device * activation_bytes / GIB
    return dict(params=sharded + replicated, weights=weights, gradients=weights, adamw=2 * weights,
                activations=activations)


def rows():
    h14 = preset_config("ViT-H/14")
    g = vit_22b_sized()
    return [
        Row("ViT-B/16", preset_config("ViT-B/16"), 224, (8, 1), 64),
        Row("ViT-H/14", h14, 224, (8, 1), 16),
        Row("ViT-H/14", h14, 224, (2, 4), 16),
        Row("ViT-H/14", h14, 224, (1, 16), 16),
        Row("ViT-22B-sized", g, 224, (1, 1), 1),
        Row("ViT-22B-sized", g, 224, (64, 16), 4),
        Row("ViT-22B-sized", g, 224, (32, 48), 8),
    ]


def table(weight_bytes=4, activation_bytes=2):
    """The markdown table of `rows()`."""
    lines = [
        "| model | params | mesh (batch x model) | batch / device | weights | grads | AdamW m, v | activations "
        "| total |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows():
        gib = per_device_gib(row, weight_bytes, activation_bytes)
        total = gib["weights"] + gib["gradients"] + gib["adamw"] + gib["activations"]
        cells = [f"{gib[k]:.2f}" for k in ("weights", "gradients", "adamw", "activations")]
        mesh = f"{row.mesh[0]} x {row.mesh[1]}"
        lines.append(f"| {row.name} | {gib['params'] / 1e9:.2f} B | {mesh} | {row.batch_per_device} | "
                     + " | ".join(cells) + f" | {total:.2f} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weight-bytes", type=int, default=4, help="4: float32 variables (also under mixed_bfloat16)")
    parser.add_argument("--activation-bytes", type=int, default=2, help="2: bfloat16 activations (mixed_bfloat16)")
    args = parser.parse_args(argv)
    print(table(args.weight_bytes, args.activation_bytes))
    print(f"\nGiB per device; weights {args.weight_bytes} bytes, "
          f"activations {args.activation_bytes} bytes per element.")


if __name__ == "__main__":
    main()
