"""Register tokens, the MAP head and LayerScale in checkpoints.

Canonical names: the MAP head keeps big_vision's ("MAPHead_0/probe",
"MAPHead_0/MultiHeadDotProductAttention_0/{query,key,value,out}/...", "MAPHead_0/LayerNorm_0/...",
"MAPHead_0/MlpBlock_0/Dense_{0,1}/..."), in Keras' layouts like the rest; the register tokens,
which Google's releases do not have, are "reg_tokens" (1, R, D). timm calls them `attn_pool`
(`AttentionPoolLatent`: latent, q, fused kv with rows [k; v], proj, norm, mlp.fc1/fc2) and
`reg_token`. The per-block LayerScale vectors (DINOv2's `layer_scale1.lambda1`, timm's `ls1.gamma`)
are "Transformer/encoderblock_{i}/LayerScale_0/scale" (attention) and ".../LayerScale_1/scale" (MLP),
(D,). Shapes: D width, K heads, Dh = D / K, M MLP width, R registers.
"""

import re

import numpy as np

from keras_vit.layers import LayerScale

MAP = "MAPHead_0/"
LAYER_SCALE = "Transformer/encoderblock_{}/LayerScale_{}/scale"
_LS = re.compile(r"Transformer/encoderblock_(\d+)/LayerScale_(\d)/scale")
_TIMM_LS = re.compile(r"blocks\.(\d+)\.ls([12])\.gamma")
MAP_MHA = MAP + "MultiHeadDotProductAttention_0/"
REG = "reg_tokens"


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


def extra_variables(model):
    """Canonical name -> Keras variable of the model's registers, MAP head and LayerScale."""
    v = {}
    if model.registers is not None:
        v[REG] = model.registers.tokens
    for i, block in enumerate(model.encoder.blocks):
        for j, scale in enumerate((block.ls1, block.ls2)):
            if isinstance(scale, LayerScale):
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


def timm_spec(sd):
    """The registers, pooling and LayerScale a timm state dict implies."""
    spec = {"num_register_tokens": int(sd["reg_token"].shape[1]) if "reg_token" in sd else 0,
            "layer_scale": "blocks.0.ls1.gamma" in sd}
    if "attn_pool.latent" in sd:
        spec["pooling"] = "map"
    return spec


def timm_to_canonical(sd, d, k):
    """timm's reg_token, ls{1,2}.gamma and attn_pool tensors -> canonical ones."""
    t = {REG: sd["reg_token"]} if "reg_token" in sd else {}
    for name in sd:
        match = _TIMM_LS.fullmatch(name)
        if match:
            t[LAYER_SCALE.format(match.group(1), int(match.group(2)) - 1)] = sd[name]
    if "attn_pool.latent" not in sd:
        return t
    p = "attn_pool."
    t[MAP + "probe"] = sd[p + "latent"]
    ks, vs = np.split(sd[p + "kv.weight"], 2, axis=0)  # (2D, D) rows [k; v] -> 2 x (D, D)
    kb, vb = np.split(sd[p + "kv.bias"], 2)
    for n, w, b in (("query", sd[p + "q.weight"], sd[p + "q.bias"]), ("key", ks, kb), ("value", vs, vb)):
        t[f"{MAP_MHA}{n}/kernel"] = w.T.reshape(d, k, d // k)  # (K*Dh, D) -> (D, K, Dh)
        t[f"{MAP_MHA}{n}/bias"] = b.reshape(k, d // k)
    t[MAP_MHA + "out/kernel"] = sd[p + "proj.weight"].T.reshape(k, d // k, d)  # (D, K*Dh) -> (K, Dh, D)
    t[MAP_MHA + "out/bias"] = sd[p + "proj.bias"]
    t[MAP + "LayerNorm_0/scale"], t[MAP + "LayerNorm_0/bias"] = sd[p + "norm.weight"], sd[p + "norm.bias"]
    for j in range(2):
        t[f"{MAP}MlpBlock_0/Dense_{j}/kernel"] = sd[f"{p}mlp.fc{j + 1}.weight"].T  # (out, in) -> (in, out)
        t[f"{MAP}MlpBlock_0/Dense_{j}/bias"] = sd[f"{p}mlp.fc{j + 1}.bias"]
    return t


def timm_from_canonical(t, d):
    """Canonical registers, LayerScale and MAP head -> timm's tensors; the inverse of `timm_to_canonical`."""
    sd = {"reg_token": t[REG]} if REG in t else {}
    for name in t:
        match = _LS.fullmatch(name)
        if match:
            sd[f"blocks.{match.group(1)}.ls{int(match.group(2)) + 1}.gamma"] = t[name]
    if MAP + "probe" not in t:
        return sd
    p = "attn_pool."
    sd[p + "latent"] = t[MAP + "probe"]
    w = {n: t[f"{MAP_MHA}{n}/kernel"].reshape(d, d).T for n in ("query", "key", "value")}  # (D, K, Dh) -> (K*Dh, D)
    b = {n: t[f"{MAP_MHA}{n}/bias"].reshape(d) for n in ("query", "key", "value")}
    sd[p + "q.weight"], sd[p + "q.bias"] = w["query"], b["query"]
    sd[p + "kv.weight"] = np.concatenate([w["key"], w["value"]], axis=0)  # (2D, D)
    sd[p + "kv.bias"] = np.concatenate([b["key"], b["value"]])
    sd[p + "proj.weight"], sd[p + "proj.bias"] = t[MAP_MHA + "out/kernel"].reshape(d, d).T, t[MAP_MHA + "out/bias"]
    sd[p + "norm.weight"], sd[p + "norm.bias"] = t[MAP + "LayerNorm_0/scale"], t[MAP + "LayerNorm_0/bias"]
    for j in range(2):
        sd[f"{p}mlp.fc{j + 1}.weight"] = t[f"{MAP}MlpBlock_0/Dense_{j}/kernel"].T
        sd[f"{p}mlp.fc{j + 1}.bias"] = t[f"{MAP}MlpBlock_0/Dense_{j}/bias"]
    return sd
