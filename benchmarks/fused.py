"""A prototype of a faster self-attention for keras_vit, measured by the benchmarks only.

Keras' MultiHeadAttention projects Q, K and V with three EinsumDense layers: three (B*T, D) x (D, D)
products. Here the three kernels are used as one (D, 3D) matrix, so that one larger product feeds
the matmul units better, with the same weights and the same (D, K, Dh) checkpoint layout. The
attention itself stays `ops.dot_product_attention` (fused where the backend has a kernel).

`fuse_qkv(model)` swaps every block's attention call in place; the weights are untouched.
`float32_residual(model)` is the other prototype measured here, for the bf16 logits check.

Shapes: B batch, T tokens, D width, K heads, Dh head width.
"""

import types

from keras import ops


def _fused_call(self, query, value, key=None, training=None, return_attention_scores=False, **kwargs):
    if return_attention_scores or kwargs.get("attention_mask") is not None:
        raise ValueError("the fused prototype serves plain self-attention only")
    q, k, v, o = self.query_dense, self.key_dense, self.value_dense, self.output_dense
    d, heads, dh = q.kernel.shape
    kernel = ops.concatenate([q.kernel, k.kernel, v.kernel], axis=1)  # 3 x (D, K, Dh) -> (D, 3K, Dh)
    kernel = ops.cast(ops.reshape(kernel, (d, 3 * heads * dh)), query.dtype)  # -> (D, 3 K Dh)
    bias = ops.cast(ops.reshape(ops.concatenate([q.bias, k.bias, v.bias], axis=0), (-1,)), query.dtype)
    b, t = ops.shape(query)[0], ops.shape(query)[1]
    qkv = ops.matmul(query, kernel) + bias  # (B, T, D) x (D, 3 K Dh) -> (B, T, 3 K Dh)
    qkv = ops.reshape(qkv, (b, t, 3, heads, dh))  # -> (B, T, 3, K, Dh)
    out = ops.dot_product_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], scale=dh**-0.5)  # (B, T, K, Dh)
    out = ops.reshape(out, (b, t, heads * dh))  # (B, T, K, Dh) -> (B, T, K Dh)
    w = ops.cast(ops.reshape(o.kernel, (heads * dh, d)), query.dtype)  # (K, Dh, D) -> (K Dh, D)
    return ops.matmul(out, w) + ops.cast(o.bias, query.dtype)  # (B, T, K Dh) x (K Dh, D) -> (B, T, D)


def fuse_qkv(model):
    """Makes every block of a keras_vit.ViT compute Q, K, V with one product; returns the model."""
    for block in model.encoder.blocks:
        block.attn.call = types.MethodType(_fused_call, block.attn)
    return model


def unfuse_attention(model):
    """The other direction, for comparison: MHA's explicit einsum-softmax-einsum path instead of
    `ops.dot_product_attention`. MHA takes that path whenever attention dropout is set; a rate of
    1e-9 changes nothing at inference (dropout is off) but selects the path."""
    for block in model.encoder.blocks:
        block.attn._dropout = 1e-9
    return model


def _float32_residual_call(self, x, training=None, return_attention_scores=False):
    if return_attention_scores or self.config.parallel_block:
        raise ValueError("the float32-residual prototype serves the plain pre-norm block only")
    x = ops.cast(x, "float32")  # the residual stream; the sublayers still compute in bf16
    h = self.norm1(x)
    h = self.attn(h, h, training=training)
    x = x + ops.cast(self.drop_path(self.ls1(self.dropout(h, training=training)), training=training), "float32")
    h = self.mlp(self.norm2(x), training)
    return x + ops.cast(self.drop_path(self.ls2(h), training=training), "float32")


def float32_residual(model):
    """Under a mixed policy, keeps the residual stream in float32 and adds each block's branches in
    float32 (what torch's autocast does for timm), while attention and MLP compute in bf16. Keras
    casts a layer's inputs to its compute dtype, so the blocks and the encoder are told not to."""
    model.encoder._convert_input_args = False
    for block in model.encoder.blocks:
        block._convert_input_args = False
        block.call = types.MethodType(_float32_residual_call, block)
    return model
