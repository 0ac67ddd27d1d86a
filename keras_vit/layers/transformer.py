"""The transformer encoder: pre-norm blocks of self-attention and a GELU MLP (§3.1, Eqs. 2-4).

Shapes: B batch, T tokens, D model width, K heads, Dh = D / K head width, M MLP width.
"""

import keras
from keras import ops

from keras_vit.layers.attention import self_attention


@keras.saving.register_keras_serializable(package="keras_vit")
class LayerScale(keras.layers.Layer):
    """Multiplies each channel by a learned scale initialized to `init_value` (Touvron et al., 2021).

    Keras has no such layer; it is one weight and one multiply.
    Input and output: (..., D).
    """

    def __init__(self, init_value, **kwargs):
        super().__init__(**kwargs)
        self.init_value = float(init_value)

    def build(self, input_shape):
        self.gamma = self.add_weight(
            shape=(input_shape[-1],),
            initializer=keras.initializers.Constant(self.init_value),
            name="gamma",
        )

    def call(self, x):
        return x * ops.cast(self.gamma, x.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(init_value=self.init_value)
        return config


def gelu(x, approximate=False):
    """GELU (Hendrycks & Gimpel, 2016). On TensorFlow the exact form is written with `erf`:
    `tf.nn.gelu` uses `erfc`, which ONNX lacks, so tf2onnx emits a graph that ONNX Runtime refuses.
    The other backends' own GELU kernels already export cleanly and are kept for speed."""
    if approximate or keras.backend.backend() != "tensorflow":
        return keras.activations.gelu(x, approximate=approximate)
    return 0.5 * x * (1.0 + ops.erf(x * 0.7071067811865476))  # x * Phi(x), Phi the normal CDF


def drop_path(rate, name, dtype):
    """Stochastic depth: drops a whole residual branch per sample (Huang et al., 2016).

    Keras' Dropout with the noise shape (B, 1, 1) is exactly that: one Bernoulli draw per sample,
    survivors scaled by 1 / (1 - rate).
    """
    return keras.layers.Dropout(rate, noise_shape=(None, 1, 1), name=name, dtype=dtype)


@keras.saving.register_keras_serializable(package="keras_vit")
class TransformerBlock(keras.layers.Layer):
    """One pre-norm encoder block:

        z' = z + DropPath(LS(MSA(LN(z))))
        z  = z' + DropPath(LS(MLP(LN(z'))))

    Attention is `keras.layers.MultiHeadAttention`, whose kernels (D, K, Dh) and (K, Dh, D) have the
    layout of Google's checkpoints. Without `return_attention_scores` it takes Keras' fused
    `ops.dot_product_attention` path and never forms the (T, T) probabilities.

    Args:
        num_heads: K; must divide the width D of the input.
        mlp_dim: M, the hidden width of the MLP.
        dropout_rate: dropout after the attention output and in the MLP.
        attention_dropout_rate: dropout on the attention probabilities.
        drop_path_rate: stochastic-depth rate of both residual branches.
        layer_norm_epsilon: epsilon of both LayerNorms.
        gelu_approximate: tanh approximation of GELU (Flax's default, used by Google's
            checkpoints) instead of the exact erf form (timm, Hugging Face).
        layer_scale_init: initial LayerScale value, or None for no LayerScale.
        qk_norm: LayerNorm on queries and keys per head (ViT-22B; timm `qk_norm=True`).
        parallel_block: ViT-22B's parallel block (timm `ParallelScalingBlock`): attention and MLP
            read the same LayerNorm and their outputs are summed,
            z = z + DropPath(LS(MSA(LN(z)) + MLP(LN(z)))); there is no `norm2` and one LayerScale.
        use_bias: False drops the biases of the Q, K, V projections and of every LayerNorm
            (ViT-22B, §2); the attention output projection and the MLP keep theirs (timm
            `qkv_bias=False` with a bias-free LayerNorm). ViT-22B also drops the LayerNorms'
            centering; that is not done here, as in timm.

    Input: (B, T, D). Output: (B, T, D), and with `return_attention_scores=True` also the
    attention probabilities (B, K, T, T).
    """

    def __init__(
        self,
        num_heads,
        mlp_dim,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        drop_path_rate=0.0,
        layer_norm_epsilon=1e-6,
        gelu_approximate=False,
        layer_scale_init=None,
        qk_norm=False,
        parallel_block=False,
        use_bias=True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.qk_norm = bool(qk_norm)
        self.parallel_block = bool(parallel_block)
        self.use_bias = bool(use_bias)
        self.num_heads = int(num_heads)
        self.mlp_dim = int(mlp_dim)
        self.dropout_rate = float(dropout_rate)
        self.attention_dropout_rate = float(attention_dropout_rate)
        self.drop_path_rate = float(drop_path_rate)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.gelu_approximate = bool(gelu_approximate)
        self.layer_scale_init = None if layer_scale_init is None else float(layer_scale_init)

    def build(self, input_shape):
        width = input_shape[-1]
        if width % self.num_heads:
            raise ValueError(
                f"num_heads={self.num_heads} does not divide the width {width}; "
                f"use a divisor of {width}"
            )
        policy = self.dtype_policy
        self.norm1 = _layer_norm(self.layer_norm_epsilon, "norm1", policy, self.use_bias)
        self.attn = self_attention(
            width, self.num_heads, dropout=self.attention_dropout_rate, qk_norm=self.qk_norm,
            use_bias=self.use_bias, norm_epsilon=self.layer_norm_epsilon, dtype=policy, name="attn",
        )
        self.norm2 = None
        if not self.parallel_block:
            self.norm2 = _layer_norm(self.layer_norm_epsilon, "norm2", policy, self.use_bias)
        self.fc1 = _dense(self.mlp_dim, "fc1", policy)
        self.fc2 = _dense(width, "fc2", policy)
        self.dropout = keras.layers.Dropout(self.dropout_rate, dtype=policy, name="dropout")
        self.drop_path = drop_path(self.drop_path_rate, "drop_path", policy)
        self.ls1 = self.ls2 = None
        if self.layer_scale_init is not None:
            self.ls1 = LayerScale(self.layer_scale_init, dtype=policy, name="ls1")
            self.ls1.build(input_shape)
            if not self.parallel_block:  # the parallel block scales the sum once
                self.ls2 = LayerScale(self.layer_scale_init, dtype=policy, name="ls2")
                self.ls2.build(input_shape)
        self.norm1.build(input_shape)
        self.attn.build(input_shape, input_shape)
        if self.norm2 is not None:
            self.norm2.build(input_shape)
        self.fc1.build(input_shape)
        self.fc2.build(tuple(input_shape[:-1]) + (self.mlp_dim,))

    def call(self, x, training=None, return_attention_scores=False):
        h = self.norm1(x)
        y = h
        if return_attention_scores:
            h, scores = self.attn(y, y, return_attention_scores=True, training=training)
        else:
            h = self.attn(y, y, training=training)
        if self.parallel_block:
            h = self.dropout(h, training=training) + self.mlp(y, training)  # both branches read LN(z)
            x = x + self.drop_path(self._scale(self.ls1, h), training=training)
            return (x, scores) if return_attention_scores else x
        x = x + self.drop_path(self._scale(self.ls1, self.dropout(h, training=training)), training=training)
        x = x + self.drop_path(self._scale(self.ls2, self.mlp(self.norm2(x), training)), training=training)
        return (x, scores) if return_attention_scores else x

    def mlp(self, x, training=None):
        """MLP(x) = fc2(Dropout(GELU(fc1(x)))), followed by dropout."""
        h = gelu(self.fc1(x), approximate=self.gelu_approximate)  # (B, T, M)
        h = self.fc2(self.dropout(h, training=training))  # (B, T, M) -> (B, T, D)
        return self.dropout(h, training=training)

    @staticmethod
    def _scale(layer_scale, x):
        return x if layer_scale is None else layer_scale(x)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            mlp_dim=self.mlp_dim,
            dropout_rate=self.dropout_rate,
            attention_dropout_rate=self.attention_dropout_rate,
            drop_path_rate=self.drop_path_rate,
            layer_norm_epsilon=self.layer_norm_epsilon,
            gelu_approximate=self.gelu_approximate,
            layer_scale_init=self.layer_scale_init,
            qk_norm=self.qk_norm,
            parallel_block=self.parallel_block,
            use_bias=self.use_bias,
        )
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class Encoder(keras.layers.Layer):
    """`num_layers` transformer blocks followed by the final LayerNorm.

    Stochastic depth grows linearly with depth, from 0 in the first block to `drop_path_rate` in
    the last, as in DeiT and timm. The other arguments are those of `TransformerBlock`; with
    `use_bias=False` the final LayerNorm has no bias either. `final_norm=False` leaves the final
    LayerNorm out, for heads that normalize after pooling instead (timm's `fc_norm`).

    Input: (B, T, D). Output: (B, T, D), and with `return_attention_scores=True` also a list of
    `num_layers` arrays of attention probabilities (B, K, T, T).
    """

    def __init__(
        self,
        num_layers,
        num_heads,
        mlp_dim,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        drop_path_rate=0.0,
        layer_norm_epsilon=1e-6,
        gelu_approximate=False,
        layer_scale_init=None,
        qk_norm=False,
        parallel_block=False,
        use_bias=True,
        final_norm=True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.qk_norm = bool(qk_norm)
        self.parallel_block = bool(parallel_block)
        self.use_bias = bool(use_bias)
        self.final_norm = bool(final_norm)
        self.num_layers = int(num_layers)
        self.num_heads = int(num_heads)
        self.mlp_dim = int(mlp_dim)
        self.dropout_rate = float(dropout_rate)
        self.attention_dropout_rate = float(attention_dropout_rate)
        self.drop_path_rate = float(drop_path_rate)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.gelu_approximate = bool(gelu_approximate)
        self.layer_scale_init = layer_scale_init
        self.blocks = [
            TransformerBlock(
                num_heads=num_heads,
                mlp_dim=mlp_dim,
                dropout_rate=dropout_rate,
                attention_dropout_rate=attention_dropout_rate,
                drop_path_rate=drop_path_rate * i / max(self.num_layers - 1, 1),
                layer_norm_epsilon=layer_norm_epsilon,
                gelu_approximate=gelu_approximate,
                layer_scale_init=layer_scale_init,
                qk_norm=qk_norm,
                parallel_block=parallel_block,
                use_bias=use_bias,
                dtype=self.dtype_policy,
                name=f"block_{i}",
            )
            for i in range(self.num_layers)
        ]
        self.norm = None
        if self.final_norm:
            self.norm = _layer_norm(layer_norm_epsilon, "norm", self.dtype_policy, self.use_bias)

    def build(self, input_shape):
        for block in self.blocks:
            block.build(input_shape)
        if self.norm is not None:
            self.norm.build(input_shape)

    def call(self, x, training=None, return_attention_scores=False):
        scores = []
        for block in self.blocks:
            if return_attention_scores:
                x, s = block(x, training=training, return_attention_scores=True)
                scores.append(s)
            else:
                x = block(x, training=training)
        if self.norm is not None:
            x = self.norm(x)
        return (x, scores) if return_attention_scores else x

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            mlp_dim=self.mlp_dim,
            dropout_rate=self.dropout_rate,
            attention_dropout_rate=self.attention_dropout_rate,
            drop_path_rate=self.drop_path_rate,
            layer_norm_epsilon=self.layer_norm_epsilon,
            gelu_approximate=self.gelu_approximate,
            layer_scale_init=self.layer_scale_init,
            qk_norm=self.qk_norm,
            parallel_block=self.parallel_block,
            use_bias=self.use_bias,
            final_norm=self.final_norm,
        )
        return config


def _layer_norm(epsilon, name, policy, center=True):
    """`center=False` drops the bias (beta), as ViT-22B does."""
    return keras.layers.LayerNormalization(epsilon=epsilon, center=center, dtype=policy, name=name)


def _dense(units, name, policy):
    """A Dense layer initialized as in the official code: Xavier-uniform kernel, bias N(0, 1e-6)."""
    return keras.layers.Dense(
        units,
        kernel_initializer="glorot_uniform",
        bias_initializer=keras.initializers.RandomNormal(stddev=1e-6),
        dtype=policy,
        name=name,
    )
