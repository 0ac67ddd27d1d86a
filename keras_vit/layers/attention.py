"""Multi-head self-attention: one fused QKV product, the ViT-22B switches (QK-norm, no QKV bias).

Shapes: B batch, T query tokens, S key tokens, D width, K heads, Dh = D / K head width.
"""

import contextlib
import math

import keras
from keras import ops

from keras_vit.layers.attention_core import attend
from keras_vit.layers.dense import matmul
from keras_vit.layers.normalization import LayerNormalization

# What this layer relies on of Keras' private API is listed, and checked, in keras_vit.upstream.


@keras.saving.register_keras_serializable(package="keras_vit")
class Attention(keras.layers.MultiHeadAttention):
    """`keras.layers.MultiHeadAttention` that computes self-attention with one QKV product, with
    optional QK-norm (Dehghani et al., 2023) and an optional QKV bias.

    The variables are Keras' own, so checkpoints and `.keras` files load unchanged: Q, K, V kernels
    (D, K, Dh) with biases (K, Dh), output kernel (K, Dh, D). For plain self-attention `call` uses
    them as one (D, 3D) matrix: one matmul instead of three einsums, with the 1/sqrt(Dh) scale
    folded into the query columns (without QK-norm, where it commutes). Exported graphs then have
    the plain MatMul/Add/SDPA shape of timm's, and a runtime folds the concatenation of constant
    kernels away. The attention core is `keras_vit.layers.attention_core.attend`:
    `ops.dot_product_attention`, except on JAX on a CPU, where it runs as 3-D batched products
    that XLA:CPU runs faster, and on TensorFlow's own executor on a CPU, where it transposes the
    packed Q, K, V once for two batched products. An `attention_mask` (B, T or 1, S), as a padded
    patch sequence's key mask, is applied there too, as the boolean `mask` of `ops.dot_product_attention`
    (benchmarks/studies/attention_mask.py measured it against an additive bias). Cross-attention,
    the inputs' Keras masks, `return_attention_scores`, attention dropout in training and quantized
    projections (`keras.Model.quantize`) take Keras' own path. A projection
    with LoRA (`enable_lora`) keeps the fused path: its `kernel` is the merged W + (alpha / r) A B.

    Keras' layer has no hook for normalizing queries and keys, so this subclass also overrides
    `_compute_attention`, the method Keras documents for customizing attention ("Users can override
    this function"): it applies a LayerNorm over Dh to Q (B, T, K, Dh) and K (B, S, K, Dh) (one
    scale shared by the heads, as in ViT-22B and timm's `qk_norm=True`). What the layer uses of
    Keras' private API is listed in `keras_vit.upstream`, whose `changes()` checks it against the
    installed Keras (`tests/meta/test_upstream.py`), so an upstream rename fails loudly.

    Args:
        num_heads: as in `MultiHeadAttention`.
        key_dim: as in `MultiHeadAttention`.
        qk_norm: LayerNorm on queries and keys before the dot product.
        qkv_bias: bias on the Q, K and V projections. The output projection always has one
            (ViT-22B drops only the QKV biases).
        norm_epsilon: epsilon of the QK norms.
        norm_bias: whether the QK norms have a bias (beta).
        **kwargs: the other `MultiHeadAttention` arguments, except `use_bias`.

    Input: query (B, T, D), value (B, S, D), optional attention_mask (B, T or 1, S) boolean, True
    where a query may attend to a key. Output: (B, T, D) [and scores (B, K, T, S)].
    """

    def __init__(self, num_heads, key_dim, qk_norm=False, qkv_bias=True, norm_epsilon=1e-6, norm_bias=True, **kwargs):
        super().__init__(num_heads=num_heads, key_dim=key_dim, use_bias=bool(qkv_bias), **kwargs)
        self.qk_norm = bool(qk_norm)
        self.qkv_bias = bool(qkv_bias)
        self.norm_epsilon = float(norm_epsilon)
        self.norm_bias = bool(norm_bias)
        self.q_norm = self.k_norm = None
        self._probability_offset = None

    def build(self, query_shape, value_shape, key_shape=None):
        super().build(query_shape, value_shape, key_shape)
        if self.qk_norm:
            head_shape = (None, None, self.num_heads, self.key_dim)  # (B, T, K, Dh)
            self.q_norm = self._norm("q_norm")
            self.k_norm = self._norm("k_norm")
            self.q_norm.build(head_shape)
            self.k_norm.build(head_shape)

    def _norm(self, name):
        return LayerNormalization(
            epsilon=self.norm_epsilon, center=self.norm_bias, dtype=self.dtype_policy, name=name
        )

    def _keras_private(self, name):
        """The private MultiHeadAttention attribute `name` (one of `upstream.MHA_ATTRIBUTES`)."""
        try:
            return getattr(self, name)
        except AttributeError:
            raise AttributeError(
                f"keras {keras.__version__}: MultiHeadAttention has no attribute {name!r}, which "
                "keras_vit.layers.Attention reads; keras_vit.upstream.changes() "
                "lists what changed, and pyproject.toml names the Keras versions it was tested on"
            ) from None

    def _make_output_dense(self, query_shape, common_kwargs, name=None):
        # Keras ties the output bias to `use_bias`; ViT-22B keeps it while dropping the QKV biases.
        use_bias, self._use_bias = self._keras_private("_use_bias"), True
        try:
            return super()._make_output_dense(query_shape, common_kwargs, name=name)
        finally:
            self._use_bias = use_bias

    def call(self, query, value, key=None, query_mask=None, value_mask=None, key_mask=None, attention_mask=None,
             return_attention_scores=False, training=None, **kwargs):
        # The *_mask arguments are named so that Keras fills them from the inputs' masks, as it does
        # for MultiHeadAttention; those take Keras' path, an explicit attention_mask the fused one.
        masks = dict(query_mask=query_mask, value_mask=value_mask, key_mask=key_mask, attention_mask=attention_mask)
        inputs_masks = {**masks, "attention_mask": None}
        if self._fused_path(query, value, key, return_attention_scores, training, {**inputs_masks, **kwargs}):
            return self._fused_self_attention(query, attention_mask)
        return super().call(query, value, key=key, return_attention_scores=return_attention_scores,
                            training=training, **masks, **kwargs)

    def _fused_path(self, query, value, key, return_attention_scores, training, options):
        """Whether `call` is plain self-attention, which `_fused_self_attention` computes."""
        # Identity, not equality: the same tensor passed as query and value (and key) is self-attention.
        self_attn = value is query and (key is None or key is query)
        plain = all(v is None or v is False for v in options.values())  # no mask, no causal mask
        layout = (self._keras_private("_output_shape") is None and self.attention_axes in (None, (1,))
                  and not self._keras_private("_use_gate") and self._keras_private("_sliding_window") is None)
        return (self_attn and plain and layout and not return_attention_scores and len(query.shape) == 3
                and self.value_dim == self.key_dim and not (training and self.dropout > 0.0)
                and not self.quantized)

    @property
    def quantized(self):
        """Whether `keras.Model.quantize` quantized any projection. Their `kernel` is then the
        integer (or float8) kernel without its scales, so the fused product cannot read it, and
        `call` takes Keras' path, where each projection applies its own scales."""
        denses = (self.query_dense, self.key_dense, self.value_dense, self.output_dense)
        return any(dense.quantization_mode is not None for dense in denses)

    def _fused_self_attention(self, x, attention_mask=None):
        """(B, T, D) -> (B, T, D): softmax(Q K^T / sqrt(Dh)) V, projected, with Q, K, V from one product;
        `attention_mask` (B, T or 1, S), True where a query attends to a key, or None."""
        heads, dh = self.num_heads, self.key_dim
        t = ops.shape(x)[1]
        qkv_bias = self._qkv_bias(self.compute_dtype) if self.qkv_bias else None
        qkv = matmul(x, self._qkv_kernel(self.compute_dtype), qkv_bias)  # (B, T, D) x (D, 3 K Dh) -> (B, T, 3 K Dh)
        qkv = ops.reshape(qkv, (-1, t, 3, heads, dh))  # -> (B, T, 3, K, Dh)
        scale = 1.0
        if self.qk_norm:  # the norms undo a scale folded into Q, so it is applied after them
            q, k, v = ops.unstack(qkv, 3, axis=2)  # 3 x (B, T, K, Dh)
            qkv = ops.stack([self.q_norm(q), self.k_norm(k), v], axis=2)
            scale = 1.0 / math.sqrt(self.key_dim)
        mask = None if attention_mask is None else ops.expand_dims(attention_mask, 1)  # -> (B, 1, T or 1, S)
        out = self._attend(qkv, scale, mask)  # (B, T, K, Dh)
        out = ops.reshape(out, (-1, t, heads * dh))  # (B, T, K, Dh) -> (B, T, K Dh)
        dense = self.output_dense
        w = ops.reshape(ops.cast(dense.kernel, self.compute_dtype), (heads * dh, -1))  # (K, Dh, D) -> (K Dh, D)
        return matmul(out, w, ops.cast(dense.bias, self.compute_dtype))  # (B, T, K Dh) x (K Dh, D) -> (B, T, D)

    def _attend(self, qkv, scale, mask):
        """The attention core of the fused path: `keras_vit.layers.attention_core.attend`."""
        return attend(qkv, scale, mask)

    def _query_scale(self):
        """The factor folded into the query kernel and bias: 1/sqrt(Dh), or 1 with QK-norm."""
        return 1.0 if self.qk_norm else 1.0 / math.sqrt(self.key_dim)

    def _qkv_kernel(self, dtype):
        """The Q, K, V kernels (D, K, Dh) as one (D, 3 K Dh) matrix, Q's columns scaled."""
        d = self.query_dense.kernel.shape[0]
        q, k, v = (ops.reshape(ops.cast(dense.kernel, dtype), (d, -1))  # (D, K, Dh) -> (D, K Dh)
                   for dense in (self.query_dense, self.key_dense, self.value_dense))
        return ops.concatenate([q * self._query_scale(), k, v], axis=-1)

    def _qkv_bias(self, dtype):
        """The Q, K, V biases (K, Dh) as one (3 K Dh,) vector, Q's scaled like its kernel."""
        q, k, v = (ops.reshape(ops.cast(dense.bias, dtype), (-1,))
                   for dense in (self.query_dense, self.key_dense, self.value_dense))
        return ops.concatenate([q * self._query_scale(), k, v], axis=0)

    def _compute_attention(self, query, key, value, attention_mask=None, training=None,
                           return_attention_scores=False, **kwargs):
        if self.qk_norm:
            query, key = self.q_norm(query), self.k_norm(key)  # (B, T, K, Dh), (B, S, K, Dh) over Dh
        return super()._compute_attention(
            query, key, value, attention_mask, training, return_attention_scores, **kwargs
        )

    @contextlib.contextmanager
    def offset_probabilities(self, offset):
        """Within this context, the explicit path (`return_attention_scores=True`) adds `offset`
        (B, K, T, S) to the attention probabilities before they weight the values, and returns
        the sum as the scores.

        With a zero offset the output is unchanged, and the gradient with respect to the offset is
        the gradient with respect to the probabilities: what `keras_vit.class_relevance` needs.
        JAX differentiates only with respect to a function's inputs, never an intermediate
        tensor, so the probabilities are made an input this way on every backend.
        """
        self._probability_offset = offset
        try:
            yield
        finally:
            self._probability_offset = None

    def _masked_softmax(self, attention_scores, attention_mask=None):
        probs = super()._masked_softmax(attention_scores, attention_mask)  # (B, K, T, S)
        if self._probability_offset is None:
            return probs
        return probs + ops.cast(self._probability_offset, probs.dtype)

    def get_config(self):
        config = super().get_config()
        config.pop("use_bias")
        config.update(qk_norm=self.qk_norm, qkv_bias=self.qkv_bias, norm_epsilon=self.norm_epsilon,
                      norm_bias=self.norm_bias)
        return config


def self_attention(width, num_heads, dropout=0.0, qk_norm=False, use_bias=True, norm_epsilon=1e-6, dtype=None,
                   name="attn"):
    """The attention layer of a transformer block: `Attention`, whose variables are those of Keras'
    `MultiHeadAttention`, so checkpoints and `.keras` files of either load into it.
    `use_bias=False` drops the QKV biases and the QK norms' biases."""
    return Attention(num_heads=num_heads, key_dim=width // num_heads, dropout=dropout, qk_norm=qk_norm,
                     qkv_bias=use_bias, norm_epsilon=norm_epsilon, norm_bias=use_bias,
                     kernel_initializer="glorot_uniform", dtype=dtype, name=name)
