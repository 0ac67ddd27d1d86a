"""A NumPy forward pass of ViT written from the paper's equations (§3.1, Eqs. 1-4), in float64.

It reads the weights of a keras_vit.ViT but none of its code, so the tests can check the Keras
layers against the math. Shapes: B batch, N patches, T tokens, D width, K heads, Dh head width.
"""

import math

import numpy as np
from keras import ops


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
