"""Multi-head self-attention with the ViT-22B switches: QK-norm and no QKV bias (Dehghani et al., 2023).

Shapes: B batch, T query tokens, S key tokens, D width, K heads, Dh = D / K head width.
"""

import inspect

import keras


@keras.saving.register_keras_serializable(package="keras_vit")
class Attention(keras.layers.MultiHeadAttention):
    """`keras.layers.MultiHeadAttention` with optional QK-norm and an optional QKV bias.

    Keras' layer has no hook for normalizing queries and keys, so this subclass overrides
    `_compute_attention`, the method Keras documents for customizing attention ("Users can override
    this function"): it receives the projected Q (B, T, K, Dh) and K (B, S, K, Dh), applies a
    LayerNorm over Dh to each (one scale shared by the heads, as in ViT-22B and timm's
    `qk_norm=True`), and hands them back to Keras, so the fused `dot_product_attention` path and
    `return_attention_scores` work unchanged. `tests/test_options.py` checks the signature of
    `_compute_attention` and that the norms change the output, so an upstream rename fails loudly.
    The kernels keep Keras' layout, (D, K, Dh) for Q, K, V and (K, Dh, D) for the output.

    Args:
        num_heads: as in `MultiHeadAttention`.
        key_dim: as in `MultiHeadAttention`.
        qk_norm: LayerNorm on queries and keys before the dot product.
        qkv_bias: bias on the Q, K and V projections. The output projection always has one
            (ViT-22B drops only the QKV biases).
        norm_epsilon: epsilon of the QK norms.
        norm_bias: whether the QK norms have a bias (beta).
        **kwargs: the other `MultiHeadAttention` arguments, except `use_bias`.

    Input: query (B, T, D), value (B, S, D). Output: (B, T, D) [and scores (B, K, T, S)].
    """

    def __init__(self, num_heads, key_dim, qk_norm=False, qkv_bias=True, norm_epsilon=1e-6, norm_bias=True, **kwargs):
        super().__init__(num_heads=num_heads, key_dim=key_dim, use_bias=bool(qkv_bias), **kwargs)
        self.qk_norm = bool(qk_norm)
        self.qkv_bias = bool(qkv_bias)
        self.norm_epsilon = float(norm_epsilon)
        self.norm_bias = bool(norm_bias)
        self.q_norm = self.k_norm = None

    def build(self, query_shape, value_shape, key_shape=None):
        super().build(query_shape, value_shape, key_shape)
        if self.qk_norm:
            head_shape = (None, None, self.num_heads, self.key_dim)  # (B, T, K, Dh)
            self.q_norm = self._norm("q_norm")
            self.k_norm = self._norm("k_norm")
            self.q_norm.build(head_shape)
            self.k_norm.build(head_shape)

    def _norm(self, name):
        return keras.layers.LayerNormalization(
            epsilon=self.norm_epsilon, center=self.norm_bias, dtype=self.dtype_policy, name=name
        )

    def _make_output_dense(self, query_shape, common_kwargs, name=None):
        # Keras ties the output bias to `use_bias`; ViT-22B keeps it while dropping the QKV biases.
        use_bias, self._use_bias = self._use_bias, True
        try:
            return super()._make_output_dense(query_shape, common_kwargs, name=name)
        finally:
            self._use_bias = use_bias

    def _compute_attention(self, query, key, value, attention_mask=None, training=None,
                           return_attention_scores=False, **kwargs):
        if self.qk_norm:
            query, key = self.q_norm(query), self.k_norm(key)  # (B, T, K, Dh), (B, S, K, Dh) over Dh
        return super()._compute_attention(
            query, key, value, attention_mask, training, return_attention_scores, **kwargs
        )

    def get_config(self):
        config = super().get_config()
        config.pop("use_bias")
        config.update(qk_norm=self.qk_norm, qkv_bias=self.qkv_bias, norm_epsilon=self.norm_epsilon,
                      norm_bias=self.norm_bias)
        return config


def self_attention(width, num_heads, dropout=0.0, qk_norm=False, use_bias=True, norm_epsilon=1e-6, dtype=None,
                   name="attn"):
    """The attention layer of a transformer block: Keras' `MultiHeadAttention`, or `Attention` when
    QK-norm or bias-free projections are asked for. Both keep the same variables, so checkpoints and
    `.keras` files load into either. `use_bias=False` also drops the QK norms' biases."""
    common = dict(num_heads=num_heads, key_dim=width // num_heads, dropout=dropout,
                  kernel_initializer="glorot_uniform", dtype=dtype, name=name)
    if not qk_norm and use_bias:
        return keras.layers.MultiHeadAttention(**common)
    return Attention(qk_norm=qk_norm, qkv_bias=use_bias, norm_epsilon=norm_epsilon, norm_bias=use_bias, **common)


# The positional arguments this layer passes to Keras' `_compute_attention`; a test compares them
# with the installed Keras so that a changed signature is caught.
COMPUTE_ATTENTION_ARGS = ("self", "query", "key", "value", "attention_mask", "training", "return_attention_scores")


def keras_compute_attention_args():
    """The leading parameter names of the installed `MultiHeadAttention._compute_attention`."""
    params = inspect.signature(keras.layers.MultiHeadAttention._compute_attention).parameters
    return tuple(params)[: len(COMPUTE_ATTENTION_ARGS)]
