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
PRESETS = tuple(f"ViT-{size}/{patch}" for size in SIZES for patch in PATCH_SIZES)


def preset_config(name):
    """Constructor arguments of the preset `name`, e.g. "ViT-B/16".

    The listed presets use the paper's patch sizes (8, 14, 16, 32); any other positive patch size
    is accepted too ("ViT-Ti/4" for 32 px images).
    """
    match = re.fullmatch(r"ViT-(Ti|S|B|L|H)/(\d+)", str(name))
    if not match or int(match.group(2)) < 1:
        raise ValueError(f"Unknown preset {name!r}. Known presets: {', '.join(PRESETS)}")
    return dict(SIZES[match.group(1)], patch_size=int(match.group(2)))
