"""The canonical checkpoint layout that every format converts to and from: tensor names and
shapes for a `ViT` spec, and the Keras variable that holds each name.

The canonical names are those of Google's original vit_jax checkpoints ("embedding/kernel",
"Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel", ...), and the canonical
layouts are Keras': Conv2D (P, P, C, D), Dense (in, out), MultiHeadAttention (D, K, Dh) and
(K, Dh, D). The two coincide, so Google's files load with renaming only; timm and Hugging Face
files are transposed into them.

What vit_jax files do not have keeps big_vision's names, in the same layouts: the MAP head
("MAPHead_0/probe", "MAPHead_0/MultiHeadDotProductAttention_0/{query,key,value,out}/...",
"MAPHead_0/LayerNorm_0/...", "MAPHead_0/MlpBlock_0/Dense_{0,1}/..."); the register tokens are
"reg_tokens" (1, R, D); the per-block LayerScale vectors are
"Transformer/encoderblock_{i}/LayerScale_0/scale" (attention) and ".../LayerScale_1/scale" (MLP),
(D,). The ResNet stem of Google's hybrids sits at the top level: "conv_root/kernel",
"gn_root/{scale,bias}" and "block{stage}/unit{unit}/{conv1,conv2,conv3,conv_proj}/kernel" with
"gn1".."gn3", "gn_proj", kernels (kh, kw, C_in, C_out).

Shapes: P patch, C channels, D width, K heads, Dh = D / K, M MLP width, T position rows,
R registers or pre-logits width, N classes.
"""

from keras_vit.layers import LayerScale
from keras_vit.layers.resnet import ROOT_WIDTH, STAGE_WIDTHS

POS = "Transformer/posembed_input/pos_embedding"
BLOCK = "Transformer/encoderblock_{}/"
MHA, LN1, LN2, MLP = "MultiHeadDotProductAttention_1/", "LayerNorm_0/", "LayerNorm_2/", "MlpBlock_3/"
MAP = "MAPHead_0/"
MAP_MHA = MAP + "MultiHeadDotProductAttention_0/"
LAYER_SCALE = "Transformer/encoderblock_{}/LayerScale_{}/scale"
REG = "reg_tokens"
STEM_NORMS = ("gn1", "gn2", "gn3", "gn_proj")


def canonical_shapes(spec):
    """Name -> shape of every tensor of the ViT that `spec` describes.

    `spec` holds patch_size, num_channels, hidden_dim, num_layers, num_heads, mlp_dim, num_classes,
    representation_size, class_token, grid (h, w) and optionally fc_norm, pooling,
    num_register_tokens, layer_scale (bool), position_embedding ("learned" or "sincos") and, for a
    hybrid, stem_layers (units per stage) and image_channels.
    """
    p, c, d, m = spec["patch_size"], spec["num_channels"], spec["hidden_dim"], spec["mlp_dim"]
    k = spec["num_heads"]
    shapes = {"embedding/kernel": (p, p, c, d), "embedding/bias": (d,), **stem_shapes(spec)}
    if spec["class_token"]:
        shapes["cls"] = (1, 1, d)
    if spec.get("position_embedding", "learned") == "learned":  # a sin-cos table is computed, not stored
        prefix = int(spec["class_token"]) + spec.get("num_register_tokens", 0)
        shapes[POS] = (1, prefix + spec["grid"][0] * spec["grid"][1], d)
    shapes.update(extra_shapes(spec))  # register tokens, MAP head, LayerScale
    for i in range(spec["num_layers"]):
        b = BLOCK.format(i)
        for norm in (LN1, LN2):
            shapes.update({b + norm + "scale": (d,), b + norm + "bias": (d,)})
        for n in ("query", "key", "value"):
            shapes.update({f"{b}{MHA}{n}/kernel": (d, k, d // k), f"{b}{MHA}{n}/bias": (k, d // k)})
        shapes.update({f"{b}{MHA}out/kernel": (k, d // k, d), f"{b}{MHA}out/bias": (d,)})
        shapes.update({f"{b}{MLP}Dense_0/kernel": (d, m), f"{b}{MLP}Dense_0/bias": (m,)})
        shapes.update({f"{b}{MLP}Dense_1/kernel": (m, d), f"{b}{MLP}Dense_1/bias": (d,)})
    # timm's fc_norm models normalize the pooled features instead of the encoder output.
    norm = "fc_norm/" if spec.get("fc_norm") else "Transformer/encoder_norm/"
    shapes.update({norm + "scale": (d,), norm + "bias": (d,)})
    width = d
    if spec["representation_size"]:
        width = spec["representation_size"]
        shapes.update({"pre_logits/kernel": (d, width), "pre_logits/bias": (width,)})
    if spec["num_classes"]:
        shapes.update({"head/kernel": (width, spec["num_classes"]), "head/bias": (spec["num_classes"],)})
    return shapes


def extra_shapes(spec):
    """Name -> shape of the registers and the MAP head that `spec` has ({} for neither)."""
    d, k, m = spec["hidden_dim"], spec["num_heads"], spec["mlp_dim"]
    shapes = {}
    if spec.get("num_register_tokens"):
        shapes[REG] = (1, spec["num_register_tokens"], d)
    if spec.get("layer_scale"):
        shapes.update({LAYER_SCALE.format(i, j): (d,) for i in range(spec["num_layers"]) for j in range(2)})
    if spec.get("pooling") == "map":
        shapes[MAP + "probe"] = (1, 1, d)
        for n in ("query", "key", "value"):
            shapes.update({f"{MAP_MHA}{n}/kernel": (d, k, d // k), f"{MAP_MHA}{n}/bias": (k, d // k)})
        shapes.update({MAP_MHA + "out/kernel": (k, d // k, d), MAP_MHA + "out/bias": (d,)})
        shapes.update({MAP + "LayerNorm_0/scale": (d,), MAP + "LayerNorm_0/bias": (d,)})
        shapes.update({MAP + "MlpBlock_0/Dense_0/kernel": (d, m), MAP + "MlpBlock_0/Dense_0/bias": (m,),
                       MAP + "MlpBlock_0/Dense_1/kernel": (m, d), MAP + "MlpBlock_0/Dense_1/bias": (d,)})
    return shapes


def stem_shapes(spec):
    """Name -> shape of the stem's tensors ({} without a stem)."""
    if "stem_layers" not in spec:
        return {}
    shapes = {"conv_root/kernel": (7, 7, spec["image_channels"], ROOT_WIDTH)}
    shapes.update(_norm("gn_root/", ROOT_WIDTH))
    width = ROOT_WIDTH
    for stage, n in enumerate(spec["stem_layers"]):
        out = STAGE_WIDTHS[stage]
        mid = out // 4
        for unit in range(n):
            b = f"block{stage + 1}/unit{unit + 1}/"
            cin = width if unit == 0 else out
            shapes.update({b + "conv1/kernel": (1, 1, cin, mid), b + "conv2/kernel": (3, 3, mid, mid),
                           b + "conv3/kernel": (1, 1, mid, out)})
            for norm, c in (("gn1/", mid), ("gn2/", mid), ("gn3/", out)):
                shapes.update(_norm(b + norm, c))
            if unit == 0:  # the first unit changes width or stride, so it projects the shortcut
                shapes[b + "conv_proj/kernel"] = (1, 1, cin, out)
                shapes.update(_norm(b + "gn_proj/", out))
        width = out
    return shapes


def _norm(prefix, c):
    return {prefix + "scale": (c,), prefix + "bias": (c,)}


def model_variables(model):
    """Canonical name -> the Keras variable of `model` that holds it."""
    v = {"embedding/kernel": model.patch_embedding.conv.kernel, "embedding/bias": model.patch_embedding.conv.bias}
    v.update(stem_variables(model))
    v.update(extra_variables(model))
    if model.cls_token is not None:
        v["cls"] = model.cls_token.token
    v[POS] = model.position_embedding.embedding
    for i, block in enumerate(model.encoder.blocks):
        b = BLOCK.format(i)
        attn = block.attn
        denses = {"query": attn.query_dense, "key": attn.key_dense, "value": attn.value_dense, "out": attn.output_dense}
        for n, dense in denses.items():
            v.update({f"{b}{MHA}{n}/kernel": dense.kernel, f"{b}{MHA}{n}/bias": dense.bias})
        for prefix, layer in ((LN1, block.norm1), (LN2, block.norm2)):
            v.update({b + prefix + "scale": layer.gamma, b + prefix + "bias": layer.beta})
        for j, dense in enumerate((block.fc1, block.fc2)):
            v.update({f"{b}{MLP}Dense_{j}/kernel": dense.kernel, f"{b}{MLP}Dense_{j}/bias": dense.bias})
    for name, norm in (("Transformer/encoder_norm", model.encoder.norm), ("fc_norm", model.head.pool_norm)):
        if norm is not None:
            v.update({name + "/scale": norm.gamma, name + "/bias": norm.beta})
    for name, dense in (("pre_logits", model.head.pre_logits), ("head", model.head.classifier)):
        if dense is not None:
            v.update({f"{name}/kernel": dense.kernel, f"{name}/bias": dense.bias})
    v = {k: var for k, var in v.items() if var is not None}
    mapped = {id(var) for var in v.values()}
    unmapped = [var.path for var in model.weights if id(var) not in mapped]
    if unmapped:
        raise ValueError(f"checkpoints hold plain ViTs; this model has weights they cannot hold: {unmapped}")
    return v


def extra_variables(model):
    """Canonical name -> Keras variable of the model's registers, MAP head and LayerScale."""
    v = {}
    if model.registers is not None:
        v[REG] = model.registers.tokens
    for i, block in enumerate(model.encoder.blocks):
        for j, scale in enumerate((block.ls1, block.ls2)):
            if isinstance(scale, LayerScale):  # an Identity without LayerScale
                v[LAYER_SCALE.format(i, j)] = scale.gamma
    head = model.head.map_head
    if head is not None:
        v[MAP + "probe"] = head.probe
        attn = head.attn
        for n, dense in (("query", attn.query_dense), ("key", attn.key_dense), ("value", attn.value_dense),
                         ("out", attn.output_dense)):
            v.update({f"{MAP_MHA}{n}/kernel": dense.kernel, f"{MAP_MHA}{n}/bias": dense.bias})
        v.update({MAP + "LayerNorm_0/scale": head.norm.gamma, MAP + "LayerNorm_0/bias": head.norm.beta})
        for j, dense in enumerate((head.fc1, head.fc2)):
            v.update({f"{MAP}MlpBlock_0/Dense_{j}/kernel": dense.kernel, f"{MAP}MlpBlock_0/Dense_{j}/bias": dense.bias})
    return v


def stem_variables(model):
    """Canonical name -> Keras variable of the model's stem ({} without one)."""
    if model.stem is None:
        return {}
    stem = model.stem
    v = {"conv_root/kernel": stem.conv_root.kernel, "gn_root/scale": stem.gn_root.gamma, "gn_root/bias": stem.gn_root.beta}
    for i, stage in enumerate(stem.stages):
        for j, unit in enumerate(stage):
            b = f"block{i + 1}/unit{j + 1}/"
            for name in ("conv1", "conv2", "conv3", "conv_proj"):
                if getattr(unit, name) is not None:
                    v[f"{b}{name}/kernel"] = getattr(unit, name).kernel
            for name in STEM_NORMS:
                if getattr(unit, name) is not None:
                    v.update({f"{b}{name}/scale": getattr(unit, name).gamma, f"{b}{name}/bias": getattr(unit, name).beta})
    return v


def stem_config(spec):
    """The `ViT` arguments that a hybrid spec adds: the stem, its image channels and image size."""
    if "stem_layers" not in spec:
        return {}
    stride = 4 * 2 ** (len(spec["stem_layers"]) - 1)
    cell = stride * spec["patch_size"]
    return dict(stem="resnet50", stem_layers=spec["stem_layers"], num_channels=spec["image_channels"],
                image_size=(spec["grid"][0] * cell, spec["grid"][1] * cell))
