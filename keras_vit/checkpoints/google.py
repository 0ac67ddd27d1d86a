"""Google's `.npz` checkpoints: the original vit_jax release (AugReg, the R50+ViT hybrids) and
big_vision's (`big_vision/models/vit.py`), the image tower of SigLIP two-tower files included.

Flax's layouts are Keras' (Conv (P, P, C, D), Dense (in, out), attention (D, K, Dh), (K, Dh, D)):
the rules only rename. big_vision renames the blocks' modules, may scan-stack them with a leading
axis L, stores "pos_embedding" without a class-token row, or none for posemb="sincos2d". pool_type
"tok", "map" and "gap" load as such; "0" and "none" store nothing that tells them from "gap": pass
pooling="token" or "none". rep_size is the tanh "pre_logits" Dense. A hybrid's ResNet sits at the
top level, its GroupNorms (1, 1, 1, C) in Google's pre-Linen files. The model lies under
"opt/target/" (vit_jax), "params/" or "params/img/" (a SigLIP image tower; nothing else is read).
Shapes: P patch, C channels, D width, K heads, Dh head width, L layers.
"""

from keras_vit.checkpoints import rules as r
from keras_vit.checkpoints.rules import FLAX_NORM, Rule, positions, reshape
from keras_vit.io import npz
from keras_vit.models.resize import POSITIONS

READER = npz
# Flax's GELU is the tanh form; the official fine-tuning code resamples bilinearly (and feeds
# pixels in [-1, 1], the ViT default).
DEFAULTS = dict(gelu_approximate=True, resample_method="bilinear")
_PREFIXES = ("opt/target/", "params/", "params/img/")
_SCAN, _VIT_JAX_POS = "Transformer/encoderblock/", "Transformer/posembed_input/pos_embedding"
# (attention, second LayerNorm, MLP) of a block, in vit_jax and in big_vision.
_MODULES = {False: ("MultiHeadDotProductAttention_1", "LayerNorm_2", "MlpBlock_3"),
            True: ("MultiHeadDotProductAttention_0", "LayerNorm_1", "MlpBlock_0")}


def rules(p, big_vision, scan, prefix, group_norm=r.COPY, sincos=False):
    """The table of a file whose names start with `p`; `prefix` is the model's class-token rows."""
    mha, ln2, mlp = _MODULES[big_vision]
    b, f = "encoder/block_{i}/", p + (_SCAN if scan else "Transformer/encoderblock_{i}/")
    kb, n, attn = "/{k:kernel|bias}", FLAX_NORM, "{a:query|key|value|attention_output=out}"
    unit = p + "block{s}/unit{u}/"
    return [
        Rule("patch_embedding/conv" + kb, p + "embedding/{k}"), Rule("class_token/token", p + "cls"),
        Rule(POSITIONS, None if sincos else p + ("pos_embedding" if big_vision else _VIT_JAX_POS),
             positions(0 if big_vision else prefix, prefix)),
        Rule(b + "{m:norm1=LayerNorm_0|norm2=" + ln2 + "}/" + n, f + "{m}/{w}", stack=scan),
        Rule(b + "attn/" + attn + kb, f + mha + "/{a}/{k}", stack=scan),
        Rule(b + "{m:fc1=Dense_0|fc2=Dense_1}" + kb, f + mlp + "/{m}/{k}", stack=scan),
        Rule("encoder/norm/" + n, p + "Transformer/encoder_norm/{w}"),
        Rule("head/map_head/probe", p + "MAPHead_0/probe"),
        Rule("head/map_head/attn/" + attn + kb, p + "MAPHead_0/MultiHeadDotProductAttention_0/{a}/{k}"),
        Rule("head/map_head/norm/" + n, p + "MAPHead_0/LayerNorm_0/{w}"),
        Rule("head/map_head/{m:fc1=Dense_0|fc2=Dense_1}" + kb, p + "MAPHead_0/MlpBlock_0/{m}/{k}"),
        Rule("head/{h:pre_logits|classifier=head}" + kb, p + "{h}/{k}"),
        Rule("stem/conv_root/kernel", p + "conv_root/kernel"),
        Rule("stem/gn_root/" + n, p + "gn_root/{w}", group_norm),
        Rule("stem/block{s}_unit{u}/{c:conv1|conv2|conv3|conv_proj}/kernel", unit + "{c}/kernel"),
        Rule("stem/block{s}_unit{u}/{g:gn1|gn2|gn3|gn_proj}/" + n, unit + "{g}/{w}", group_norm),
    ]


def claims(path, config):
    """Any zip archive."""
    if not path.is_file():
        return None
    with open(path, "rb") as f:
        return path if f.read(4) == b"PK\x03\x04" else None


def source(path, shapes, metadata, side, options):
    """The model of a vit_jax or big_vision `.npz`, from its header shapes."""
    p = next((p for p in _PREFIXES if p + "embedding/kernel" in shapes), "")
    names = {k[len(p):]: s for k, s in shapes.items() if k.startswith(p)}
    if "embedding/kernel" not in names:
        raise ValueError(f"{path} has no 'embedding/kernel'; it is not a ViT checkpoint "
                         f"(found {sorted(shapes)[:8]} ...)")
    scan = any(k.startswith(_SCAN) for k in names)
    big = p.startswith("params/") or "pos_embedding" in names or any(
        k.startswith(_SCAN) or "/MlpBlock_0/" in k for k in names if k.startswith("Transformer/"))
    kernel, pos = names["embedding/kernel"], names.get("pos_embedding" if big else _VIT_JAX_POS)
    if len(kernel) != 4 or (pos is not None and (len(pos) != 3 or pos[0] != 1)):
        raise ValueError(f"embedding/kernel {kernel} and pos_embedding {pos} are not a ViT's (P, P, C, D) and "
                         "(1, N, D): a SigLIP 2 NaFlex checkpoint? It is not read yet")
    block, (mha, _, mlp) = _SCAN if scan else "Transformer/encoderblock_0/", _MODULES[big]
    first = block + mha + "/query/kernel"
    if first not in names:
        raise ValueError(f"{path} has no {p}{first}; it is not a ViT checkpoint")
    layers = r.stem_layers(names, r"block(\d+)/unit(\d+)/")
    cell, class_token = r.cell(kernel[0], layers), "cls" in names
    if pos is None and not big:
        raise ValueError(f"the checkpoint has no {_VIT_JAX_POS}; vit_jax checkpoints store a learned position table")
    # A sin-cos table is recomputed for any grid, so the training resolution does not matter.
    grid = r.size_grid(options.get("source_image_size") or (None if pos else options.get("image_size")), cell)
    if pos is not None:
        grid = r.table_grid(pos[1] - (0 if big else int(class_token)), grid)
    elif grid is None:
        raise ValueError("a sin-cos (posemb='sincos2d') checkpoint stores no position table and so no input "
                         "size; pass image_size=(H, W), e.g. the resolution it was trained at")
    model = dict(
        DEFAULTS, patch_size=kernel[0], hidden_dim=kernel[3], num_heads=names[first][-2], class_token=class_token,
        num_layers=(names[_SCAN + "LayerNorm_0/scale"][0] if scan
                    else r.count(names, r"Transformer/encoderblock_(\d+)/")),
        mlp_dim=names[block + mlp + "/Dense_0/kernel"][-1],
        num_classes=names["head/kernel"][-1] if "head/kernel" in names else 0,
        representation_size=names["pre_logits/kernel"][-1] if "pre_logits/kernel" in names else None,
        pooling="token" if class_token else "map" if "MAPHead_0/probe" in names else "gap",
        position_embedding="learned" if pos is not None else "sincos", image_size=(grid[0] * cell, grid[1] * cell),
        num_channels=kernel[2] if layers is None else names["conv_root/kernel"][2],
        **({} if layers is None else dict(stem="resnet50", stem_layers=layers)),
    )
    group_norm = reshape(lambda s: (1, 1, 1, *s)) if len(names.get("gn_root/scale", ())) == 4 else r.COPY
    return r.Source(model, rules(p, big, scan, int(class_token), group_norm, pos is None), lambda k: k.startswith(p))
