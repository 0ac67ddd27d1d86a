"""A NumPy forward pass of ViT written from the paper's equations (§3.1, Eqs. 1-4), in float64.

It reads the weights of a keras_vit.ViT but none of its code, so the tests can check the Keras
layers against the math. Shapes: B batch, N patches, T tokens, D width, K heads, Dh head width.
`param_count` is the parameter count from the same architecture, as a formula.
"""

import inspect
import math

import numpy as np
from keras import ops

from keras_vit.layers.resnet import ROOT_WIDTH, STAGE_WIDTHS


def _np(variable):
    return np.asarray(ops.convert_to_numpy(variable), np.float64)


def patchify(images, p):
    """(B, H, W, C) -> (B, N, P * P * C): patches in raster order, each flattened row by row."""
    b, h, w, c = images.shape
    x = images.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, (h // p) * (w // p), p * p * c)


def layer_norm(x, gamma, beta, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * gamma + beta


def gelu(x, approximate):
    if approximate:
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def msa(z, attn):
    """softmax(Q K^T / sqrt(Dh)) V per head, heads concatenated, then the output projection."""
    q = np.einsum("btd,dkh->bkth", z, _np(attn.query_dense.kernel)) + _np(attn.query_dense.bias)[:, None]
    k = np.einsum("btd,dkh->bkth", z, _np(attn.key_dense.kernel)) + _np(attn.key_dense.bias)[:, None]
    v = np.einsum("btd,dkh->bkth", z, _np(attn.value_dense.kernel)) + _np(attn.value_dense.bias)[:, None]
    a = softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1]))  # (B, K, T, T)
    heads = a @ v  # (B, K, T, T) x (B, K, T, Dh) -> (B, K, T, Dh)
    out = np.einsum("bkth,khd->btd", heads, _np(attn.output_dense.kernel)) + _np(attn.output_dense.bias)
    return out, a


def block(z, blk, eps, approximate):
    """z' = z + MSA(LN(z)); z = z' + MLP(LN(z')), each branch scaled by LayerScale if present."""
    ls1 = _np(blk.ls1.gamma) if hasattr(blk.ls1, "gamma") else 1.0  # an Identity when LayerScale is off
    ls2 = _np(blk.ls2.gamma) if hasattr(blk.ls2, "gamma") else 1.0
    h, a = msa(layer_norm(z, _np(blk.norm1.gamma), _np(blk.norm1.beta), eps), blk.attn)
    z = z + ls1 * h
    h = layer_norm(z, _np(blk.norm2.gamma), _np(blk.norm2.beta), eps)
    h = gelu(h @ _np(blk.fc1.kernel) + _np(blk.fc1.bias), approximate)
    return z + ls2 * (h @ _np(blk.fc2.kernel) + _np(blk.fc2.bias)), a


def vit_forward(model, images):
    """Logits (or features) and the per-layer attention (B, L, K, T, T) of `model` on `images`."""
    images = np.asarray(images, np.float64)
    p, eps, approx = model.patch_size, model.layer_norm_epsilon, model.gelu_approximate
    pe = model.patch_embedding.conv
    e = _np(pe.kernel).reshape(-1, model.hidden_dim)  # (P, P, C, D) -> (P * P * C, D)
    z = patchify(images, p) @ e + _np(pe.bias)  # Eq. 1: x_p E
    if model.class_token:
        cls = np.broadcast_to(_np(model.cls_token.token), (len(z), 1, model.hidden_dim))
        z = np.concatenate([cls, z], axis=1)
    z = z + _np(model.position_embedding.embedding)  # + E_pos
    maps = []
    for blk in model.encoder.blocks:
        z, a = block(z, blk, eps, approx)
        maps.append(a)
    norm = model.encoder.norm
    z = layer_norm(z, _np(norm.gamma), _np(norm.beta), eps)
    y = z[:, 0] if model.pooling == "token" else z[:, model.num_prefix_tokens :].mean(1)
    head = model.head
    if head.pre_logits is not None:
        y = np.tanh(y @ _np(head.pre_logits.kernel) + _np(head.pre_logits.bias))
    if head.classifier is not None:
        y = y @ _np(head.classifier.kernel) + _np(head.classifier.bias)
    return y, np.stack(maps, axis=1)


def param_count(config):
    """The number of weights of the `ViT` that `config` (a dict; missing arguments take the
    defaults) describes, from the architecture's formula: the oracle of `keras_vit.count_params`,
    which sums the shapes that the model builds."""
    c = _full_config(config)
    d, m, k = c["hidden_dim"], c["mlp_dim"], c["num_heads"]
    bias, parallel = c["use_bias"], c["parallel_block"]
    ln = 2 * d if bias else d  # LayerNorm: scale, and bias unless use_bias=False
    stem, stride, width = _stem_params(c)
    size = (c["image_size"],) * 2 if isinstance(c["image_size"], int) else tuple(c["image_size"])
    cell = stride * c["patch_size"]
    class_token = c["pooling"] == "token" if c["class_token"] is None else bool(c["class_token"])
    prefix = int(class_token) + c["num_register_tokens"]
    embed = c["patch_size"] ** 2 * width * d + d + prefix * d + (prefix + (size[0] // cell) * (size[1] // cell)) * d
    qk_norm = 2 * (d // k) * (2 if bias else 1) if c["qk_norm"] else 0
    attn = 3 * d * d + (3 * d if bias else 0) + d * d + d + qk_norm  # Q, K, V, output, QK norms
    mlp = 2 * d * m + m + d
    scales = 0 if c["layer_scale_init"] is None else d * (1 if parallel else 2)
    block = ln * (1 if parallel else 2) + attn + mlp + scales
    head = (d + 4 * d * d + 4 * d + ln + mlp) if c["pooling"] == "map" else 0  # probe, attention, LN, MLP
    rep = c["representation_size"] or 0
    head += d * rep + rep if rep else 0
    head += ((rep or d) + 1) * c["num_classes"]
    return stem + embed + c["num_layers"] * block + ln + head


def _full_config(config):
    from keras_vit import ViT

    c = dict(config)
    defaults = {n: p.default for n, p in inspect.signature(ViT.__init__).parameters.items()
                if p.default is not inspect.Parameter.empty}
    return {**defaults, **c}


def _stem_params(c):
    """(weights, stride, output width) of the ResNet stem, or (0, 1, num_channels) without one."""
    if c["stem"] is None:
        return 0, 1, c["num_channels"]
    units = tuple(c["stem_layers"] or (3, 4, 9))
    total, width = 49 * c["num_channels"] * ROOT_WIDTH + 2 * ROOT_WIDTH, ROOT_WIDTH  # 7x7 conv, GroupNorm
    for stage, n in enumerate(units):
        out = STAGE_WIDTHS[stage]
        mid = out // 4

        def unit(cin):  # 1x1, 3x3, 1x1 convolutions and their 3 GroupNorms (scale and bias)
            return cin * mid + 9 * mid * mid + mid * out + 4 * mid + 2 * out

        total += unit(width) + width * out + 2 * out + (n - 1) * unit(out)  # the first unit has the projection
        width = out
    return total, 4 * 2 ** (len(units) - 1), width
