"""The transformer encoder: pre-norm blocks of self-attention and a GELU MLP (§3.1, Eqs. 2-4).

Shapes: B batch, T tokens, D model width, K heads, Dh = D / K head width, M MLP width.
"""

import dataclasses
import functools

import keras
from keras import ops

from keras_vit.layers.attention import self_attention
from keras_vit.layers.dense import Dense, dense_then
from keras_vit.layers.normalization import LayerNormalization


@dataclasses.dataclass(frozen=True)
class BlockConfig:
    """The options of a transformer block. An `Encoder` takes one and gives it to each block.

    Attributes:
        num_heads: K; must divide the width D of the input.
        mlp_dim: M, the hidden width of the MLP.
        dropout_rate: dropout after the attention output and in the MLP.
        attention_dropout_rate: dropout on the attention probabilities.
        drop_path_rate: stochastic-depth rate of the residual branches.
        layer_norm_epsilon: epsilon of the LayerNorms.
        gelu_approximate: tanh approximation of GELU (Flax's default, used by Google's
            checkpoints) instead of the exact erf form (timm, Hugging Face).
        layer_scale_init: initial LayerScale value, or None for no LayerScale.
        qk_norm: LayerNorm on queries and keys per head (ViT-22B; timm `qk_norm=True`).
        parallel_block: ViT-22B's parallel block: attention and MLP read one LayerNorm, and
            their sum is added to the residual (see `TransformerBlock`).
        use_bias: False drops the biases of the Q, K, V projections and of every LayerNorm
            (ViT-22B, §2); the attention output projection and the MLP keep theirs (timm
            `qkv_bias=False` with a bias-free LayerNorm). ViT-22B also drops the LayerNorms'
            centering; that is not done here, as in timm.
    """

    num_heads: int
    mlp_dim: int
    dropout_rate: float = 0.0
    attention_dropout_rate: float = 0.0
    drop_path_rate: float = 0.0
    layer_norm_epsilon: float = 1e-6
    gelu_approximate: bool = False
    layer_scale_init: float | None = None
    qk_norm: bool = False
    parallel_block: bool = False
    use_bias: bool = True

    def __post_init__(self):
        # Plain Python values, so that `get_config` is JSON whatever the caller passed (numpy ints).
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is not None:
                cast = float if field.name == "layer_scale_init" else field.type
                object.__setattr__(self, field.name, cast(value))

    @classmethod
    def from_options(cls, block=None, **options):
        """A `BlockConfig` from a config, a dict of its fields, or its fields as keyword arguments."""
        if isinstance(block, cls) and not options:
            return block
        fields = dataclasses.asdict(block) if isinstance(block, cls) else dict(block or {})
        return cls(**{**fields, **options})

    @classmethod
    def pop_options(cls, kwargs):
        """Removes this config's fields from `kwargs` (a layer's keyword arguments); returns them."""
        return {f.name: kwargs.pop(f.name) for f in dataclasses.fields(cls) if f.name in kwargs}


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


def _apply(layer, x, training=None):
    """`layer(x)`, except that a part switched off (an Identity; a dropout outside training, or of
    rate 0) is not called. Eager torch runs Keras' Python for every layer call, and ViT-S/16's
    blocks hold 85 such parts per forward pass (`benchmarks.studies.torch_bf16_profile` times the
    model against timm)."""
    if isinstance(layer, keras.layers.Identity):
        return x
    if isinstance(layer, keras.layers.Dropout):
        if layer.rate == 0 or training is None or training is False:
            return x
        return layer(x, training=training)
    return layer(x)


def drop_path(rate, name, dtype):
    """Stochastic depth: drops a whole residual branch per sample (Huang et al., 2016).

    Keras' Dropout with the noise shape (B, 1, 1) is exactly that: one Bernoulli draw per sample,
    survivors scaled by 1 / (1 - rate).
    """
    return keras.layers.Dropout(rate, noise_shape=(None, 1, 1), name=name, dtype=dtype)


@keras.saving.register_keras_serializable(package="keras_vit")
class TransformerBlock(keras.layers.Layer):
    """One pre-norm encoder block (§3.1, Eqs. 2-3):

        z' = z + DropPath(LS(MSA(LN(z))))
        z  = z' + DropPath(LS(MLP(LN(z'))))

    or, with `parallel_block=True`, ViT-22B's parallel block (Dehghani et al., 2023; timm
    `ParallelScalingBlock`), whose attention and MLP read the same LayerNorm and are summed:

        z = z + DropPath(LS(MSA(LN(z)) + MLP(LN(z))))

    It has no `norm2` and no `ls2`. A part that is switched off (LayerScale, dropout, drop path)
    is an identity. Attention is `layers.Attention` (see `self_attention`), a
    `keras.layers.MultiHeadAttention` whose kernels (D, K, Dh) and (K, Dh, D) have the layout of
    Google's checkpoints. Without `return_attention_scores` it runs one fused QKV product and
    `ops.dot_product_attention`, and never forms the (T, T) probabilities.

    Args:
        num_heads: K, as in `BlockConfig`.
        mlp_dim: M, as in `BlockConfig`.
        **options: the other fields of `BlockConfig`, and the Keras layer arguments (`name`,
            `dtype`, ...).

    Input: (B, T, D), and optionally `attention_mask` (B, T or 1, T), True where a token may
    attend to another (a padded patch sequence masks its padding keys). Output: (B, T, D), and
    with `return_attention_scores=True` also the attention probabilities (B, K, T, T).
    """

    def __init__(self, num_heads, mlp_dim, **options):
        config = BlockConfig(num_heads, mlp_dim, **BlockConfig.pop_options(options))
        super().__init__(**options)  # Keras names any argument that is neither
        self.config = config

    def build(self, input_shape):
        c, width, policy = self.config, input_shape[-1], self.dtype_policy
        if width % c.num_heads:
            raise ValueError(f"num_heads={c.num_heads} does not divide the width {width}; use a divisor of {width}")
        self.norm1 = layer_norm(c, "norm1", policy)
        self.attn = self_attention(width, c.num_heads, dropout=c.attention_dropout_rate, qk_norm=c.qk_norm,
                                   use_bias=c.use_bias, norm_epsilon=c.layer_norm_epsilon, dtype=policy, name="attn")
        self.ls1 = _layer_scale(c, "ls1", policy)
        self.norm2 = self.ls2 = None  # the parallel block's MLP reads norm1's output and shares ls1
        if not c.parallel_block:
            self.norm2, self.ls2 = layer_norm(c, "norm2", policy), _layer_scale(c, "ls2", policy)
        self.fc1 = _dense(c.mlp_dim, "fc1", policy)
        self.fc2 = _dense(width, "fc2", policy)
        self.dropout = keras.layers.Dropout(c.dropout_rate, dtype=policy, name="dropout")
        self.drop_path = drop_path(c.drop_path_rate, "drop_path", policy)
        for layer in (self.norm1, self.ls1, self.norm2, self.ls2, self.fc1):
            if layer is not None:
                layer.build(input_shape)
        self.attn.build(input_shape, input_shape)
        self.fc2.build(tuple(input_shape[:-1]) + (c.mlp_dim,))

    def call(self, x, training=None, return_attention_scores=False, attention_mask=None):
        y = self.norm1(x)
        h, scores = self.attend(y, training, return_attention_scores, attention_mask)
        h = _apply(self.dropout, h, training)
        if self.config.parallel_block:
            x = x + _apply(self.drop_path, _apply(self.ls1, h + self.mlp(y, training)), training)
        else:
            x = x + _apply(self.drop_path, _apply(self.ls1, h), training)
            x = x + _apply(self.drop_path, _apply(self.ls2, self.mlp(self.norm2(x), training)), training)
        return (x, scores) if return_attention_scores else x

    def attend(self, y, training=None, return_attention_scores=False, attention_mask=None):
        """MSA(y): (B, T, D) -> (B, T, D), and the probabilities (B, K, T, T) if asked for, else None."""
        if return_attention_scores:
            return self.attn(y, y, return_attention_scores=True, training=training, attention_mask=attention_mask)
        return self.attn(y, y, training=training, attention_mask=attention_mask), None

    def mlp(self, x, training=None):
        """MLP(x) = fc2(Dropout(GELU(fc1(x)))), followed by dropout."""
        h = dense_then(self.fc1, x, functools.partial(gelu, approximate=self.config.gelu_approximate))  # -> (B, T, M)
        h = self.fc2(_apply(self.dropout, h, training))  # (B, T, M) -> (B, T, D)
        return _apply(self.dropout, h, training)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), **dataclasses.asdict(self.config)}


def ParallelTransformerBlock(num_heads, mlp_dim, **options):
    """`TransformerBlock(num_heads, mlp_dim, parallel_block=True, **options)`: ViT-22B's parallel block,
    under the name it had as a class of its own."""
    return TransformerBlock(num_heads, mlp_dim, **{**options, "parallel_block": True})


# `.keras` files saved while the parallel block was a class of its own name it by this registered name;
# their configs say parallel_block=True, so TransformerBlock itself loads them. Added to the registry
# directly: register_keras_serializable would also rename TransformerBlock in every file saved from now on.
keras.saving.get_custom_objects()["keras_vit>ParallelTransformerBlock"] = TransformerBlock


@keras.saving.register_keras_serializable(package="keras_vit")
class Encoder(keras.layers.Layer):
    """`num_layers` transformer blocks followed by the final LayerNorm.

    Stochastic depth grows linearly with depth, from 0 in the first block to `drop_path_rate` in
    the last, as in DeiT and timm.

    Args:
        num_layers: L, the number of blocks.
        block: a `BlockConfig` (or a dict of its fields) shared by the blocks; its fields may also
            be given as keyword arguments, e.g. `Encoder(2, num_heads=3, mlp_dim=96)`.
        final_norm: False leaves the final LayerNorm out, for heads that normalize after pooling
            instead (timm's `fc_norm`). With `use_bias=False` the final LayerNorm has no bias.
        **options: `BlockConfig` fields and Keras layer arguments.

    Input: (B, T, D), and optionally `attention_mask` (B, T or 1, T), given to every block.
    Output: (B, T, D), and with `return_attention_scores=True` also a list of `num_layers` arrays
    of attention probabilities (B, K, T, T).
    """

    def __init__(self, num_layers, block=None, final_norm=True, **options):
        config = BlockConfig.from_options(block, **BlockConfig.pop_options(options))
        super().__init__(**options)
        self.num_layers = int(num_layers)
        self.final_norm = bool(final_norm)
        self.block_config = config
        rates = [config.drop_path_rate * i / max(self.num_layers - 1, 1) for i in range(self.num_layers)]
        self.blocks = [TransformerBlock(**dataclasses.asdict(dataclasses.replace(config, drop_path_rate=rate)),
                            dtype=self.dtype_policy, name=f"block_{i}") for i, rate in enumerate(rates)]
        self.norm = layer_norm(config, "norm", self.dtype_policy) if self.final_norm else None

    def build(self, input_shape):
        for layer in [*self.blocks, self.norm]:
            if layer is not None:
                layer.build(input_shape)

    def call(self, x, training=None, return_attention_scores=False, attention_mask=None):
        scores = []
        for _, x, s in self.iterate(x, training=training, return_attention_scores=return_attention_scores,
                                    attention_mask=attention_mask):
            scores.append(s)
        x = self.norm_output(x)
        return (x, scores) if return_attention_scores else x

    def iterate(self, x, last=None, training=None, return_attention_scores=False, attention_mask=None):
        """Runs the blocks one by one on x (B, T, D) with `attention_mask` (see `call`), up to block
        `last` (default: all), yielding (index, its output (B, T, D), its attention probabilities
        (B, K, T, T) or None). The one block loop: `call`, `ViT.forward_intermediates`, the
        explanations and the OOD features all run through it."""
        last = self.num_layers - 1 if last is None else last
        for index, block in enumerate(self.blocks[: last + 1]):
            out = block(x, training=training, return_attention_scores=return_attention_scores,
                        attention_mask=attention_mask)
            x, scores = out if return_attention_scores else (out, None)
            yield index, x, scores

    def norm_output(self, x):
        """The final LayerNorm, or x itself when `final_norm=False`."""
        return x if self.norm is None else self.norm(x)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "num_layers": self.num_layers, "block": dataclasses.asdict(self.block_config),
                "final_norm": self.final_norm}


def select_blocks(indices, count):
    """timm's block selection: None -> every block; an int n -> the last n; a sequence -> those
    indices, negative ones from the end. Returns the sorted non-negative indices."""
    if indices is None:
        return tuple(range(count))
    if isinstance(indices, int) and not isinstance(indices, bool):
        if not 0 < indices <= count:
            raise ValueError(f"indices={indices} is not allowed; an int takes the last n blocks, 1 <= n <= {count}")
        return tuple(range(count - indices, count))
    chosen = tuple(indices) if isinstance(indices, (list, tuple)) else None
    if not chosen or any(isinstance(i, bool) or not isinstance(i, int) or not -count <= i < count for i in chosen):
        raise ValueError(f"indices={indices!r} is not allowed; use None, an int n (the last n blocks) or a list of "
                         f"block indices in [-{count}, {count})")
    return tuple(sorted({i % count for i in chosen}))


def layer_norm(config, name, policy):
    """A block's LayerNorm; without biases (`use_bias=False`) it has no beta, as ViT-22B."""
    return LayerNormalization(epsilon=config.layer_norm_epsilon, center=config.use_bias,
                              dtype=policy, name=name)


def _layer_scale(config, name, policy):
    if config.layer_scale_init is None:
        return keras.layers.Identity(dtype=policy, name=name)
    return LayerScale(config.layer_scale_init, dtype=policy, name=name)


def _dense(units, name, policy):
    """A Dense layer initialized as in the official code: Xavier-uniform kernel, bias N(0, 1e-6)."""
    return Dense(
        units,
        kernel_initializer="glorot_uniform",
        bias_initializer=keras.initializers.RandomNormal(stddev=1e-6),
        dtype=policy,
        name=name,
    )
