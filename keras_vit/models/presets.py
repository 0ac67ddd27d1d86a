"""The ViT model sizes (Dosovitskiy et al., 2021, Table 1; Ti and S from DeiT and AugReg).

A preset is named as in the paper: "ViT-B/16" is the Base size with 16 x 16 patches.
"""

import re

SIZES = {
    "Ti": dict(hidden_dim=192, num_layers=12, num_heads=3, mlp_dim=768),
    "S": dict(hidden_dim=384, num_layers=12, num_heads=6, mlp_dim=1536),
    "B": dict(hidden_dim=768, num_layers=12, num_heads=12, mlp_dim=3072),
    "L": dict(hidden_dim=1024, num_layers=24, num_heads=16, mlp_dim=4096),
    "H": dict(hidden_dim=1280, num_layers=32, num_heads=16, mlp_dim=5120),
}
PATCH_SIZES = (8, 14, 16, 32)
# The paper's hybrids (§3.1, §4.1): tokens are the 1 x 1 patches of a BiT ResNet-50 feature map,
# after an extended stage 3 (stride 16) or after stage 4 (stride 32). ViT-22B (Dehghani et al.,
# 2023): parallel blocks, QK-norm, no QKV or LayerNorm biases; with GAP pooling its count is the
# 21,743M stated for ViT-22B (a MAP head would add 0.45B). Build it as a config: `count_params(config)`.
VARIANTS = {
    "R50+ViT-B/16": dict(SIZES["B"], patch_size=1, stem="resnet50", stem_layers=(3, 4, 9)),
    "R50+ViT-L/32": dict(SIZES["L"], patch_size=1, stem="resnet50", stem_layers=(3, 4, 6, 3)),
    "ViT-22B": dict(hidden_dim=6144, num_layers=48, num_heads=48, mlp_dim=24576, patch_size=14, pooling="gap",
                    qk_norm=True, parallel_block=True, use_bias=False),
}
PRESETS = tuple(f"ViT-{size}/{patch}" for size in SIZES for patch in PATCH_SIZES) + tuple(VARIANTS)


_NAME = r"ViT-(Ti|S|B|L|H)/(\d+)"  # the paper's names, "ViT-B/16"


def is_architecture(name):
    """Whether `name` is a paper's architecture name that `preset_config` builds, not a checkpoint."""
    return name in VARIANTS or re.fullmatch(_NAME, str(name)) is not None


def preset_config(name):
    """Constructor arguments of the preset `name`, e.g. "ViT-B/16".

    The listed presets use the paper's patch sizes (8, 14, 16, 32); any other positive patch size
    is accepted too ("ViT-Ti/4" for 32 px images). `VARIANTS` adds "R50+ViT-B/16",
    "R50+ViT-L/32" and "ViT-22B".
    """
    if name in VARIANTS:
        return dict(VARIANTS[name])
    match = re.fullmatch(_NAME, str(name))
    if not match or int(match.group(2)) < 1:
        raise ValueError(f"Unknown preset {name!r}. Known presets: {', '.join(PRESETS)}")
    return dict(SIZES[match.group(1)], patch_size=int(match.group(2)))
