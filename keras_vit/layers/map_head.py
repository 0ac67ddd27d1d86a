"""Multihead attention pooling (MAP), the pooling of big_vision and SigLIP (Lee et al., 2019;
Zhai et al., 2022).

Shapes: B batch, N tokens pooled, D width, K heads, M MLP width.
"""

import keras
from keras import ops

from keras_vit.layers.normalization import LayerNormalization
from keras_vit.layers.transformer import gelu


@keras.saving.register_keras_serializable(package="keras_vit")
class MAPHead(keras.layers.Layer):
    """Pools tokens with one learned query ("probe") that attends to them, then a residual MLP:

        h = MHA(probe, x, x);  y = h + MLP(LN(h))

    as big_vision's `MAPHead` and timm's `AttentionPoolLatent` (timm key `attn_pool`). The
    attention is `keras.layers.MultiHeadAttention` (Q, K, V kernels (D, K, Dh), output (K, Dh, D),
    all with biases, as in both references).

    Args:
        num_heads: K; must divide D.
        mlp_dim: M.
        layer_norm_epsilon: epsilon of the LayerNorm.
        gelu_approximate: tanh GELU in the MLP (big_vision) or the exact form (timm).
        norm_bias: whether the LayerNorm has a bias (False in bias-free ViT-22B-style models).

    Input: (B, N, D), and optionally `token_mask` (B, N), False for padding tokens, which the probe
    does not attend to. Output: (B, D).
    """

    def __init__(self, num_heads, mlp_dim, layer_norm_epsilon=1e-6, gelu_approximate=False, norm_bias=True, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.mlp_dim = int(mlp_dim)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.gelu_approximate = bool(gelu_approximate)
        self.norm_bias = bool(norm_bias)

    def build(self, input_shape):
        width = input_shape[-1]
        if width % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} does not divide the width {width}; use a divisor of {width}")
        policy = self.dtype_policy
        self.probe = self.add_weight(shape=(1, 1, width), initializer="glorot_uniform", name="probe")
        self.attn = keras.layers.MultiHeadAttention(
            self.num_heads, width // self.num_heads, kernel_initializer="glorot_uniform", dtype=policy, name="attn"
        )
        self.norm = LayerNormalization(
            epsilon=self.layer_norm_epsilon, center=self.norm_bias, dtype=policy, name="norm"
        )
        self.fc1 = keras.layers.Dense(self.mlp_dim, dtype=policy, name="fc1")
        self.fc2 = keras.layers.Dense(width, dtype=policy, name="fc2")
        query = (input_shape[0], 1, width)
        self.attn.build(query, input_shape)
        self.norm.build(query)
        self.fc1.build(query)
        self.fc2.build((input_shape[0], 1, self.mlp_dim))

    def call(self, x, token_mask=None):
        probe = ops.broadcast_to(ops.cast(self.probe, x.dtype), (ops.shape(x)[0], 1, ops.shape(x)[-1]))  # (B, 1, D)
        mask = None if token_mask is None else ops.expand_dims(ops.cast(token_mask, "bool"), 1)  # (B, 1, N)
        h = self.attn(probe, x, attention_mask=mask)  # (B, 1, D) attends to (B, N, D) -> (B, 1, D)
        m = gelu(self.fc1(self.norm(h)), approximate=self.gelu_approximate)  # (B, 1, M)
        return (h + self.fc2(m))[:, 0]  # (B, 1, D) -> (B, D)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            mlp_dim=self.mlp_dim,
            layer_norm_epsilon=self.layer_norm_epsilon,
            gelu_approximate=self.gelu_approximate,
            norm_bias=self.norm_bias,
        )
        return config
