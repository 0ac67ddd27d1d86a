"""Classification heads: pooling, the optional tanh pre-logits layer and the classifier (§3.1).

Shapes: B batch, T tokens, D model width, R representation size, C classes.
"""

import dataclasses

import keras
from keras import ops

from keras_vit.layers.map_head import MAPHead
from keras_vit.layers.normalization import LayerNormalization
from keras_vit.layers.transformer import BlockConfig

POOLING_MODES = ("token", "gap", "map", "none")
# The arguments that the head took before `block`, in files saved then (see `from_config`).
_FLAT_OPTIONS = ("num_heads", "mlp_dim", "layer_norm_epsilon", "gelu_approximate", "norm_bias")


@keras.saving.register_keras_serializable(package="keras_vit")
class ClassifierHead(keras.layers.Layer):
    """Reads an image representation from the encoder output and classifies it.

    Args:
        num_classes: C. 0 returns the pooled features instead of logits.
        pooling: "token" reads row 0: the class token, or without prefix tokens the first patch
            token (big_vision's pool_type="0"); "gap" averages the patch tokens (the rows after
            the `num_prefix_tokens` prefix); "map" pools the patch tokens with a `MAPHead`
            (big_vision, SigLIP); "none" keeps every patch token and applies the pre-logits and
            classifier to each (big_vision's pool_type="none"). Register tokens are prefix
            tokens, so only "token" can see them, and only when there is no class token.
        representation_size: R for a Dense + tanh pre-logits layer, as in the paper's pre-training
            head, or None.
        num_prefix_tokens: tokens before the patch grid.
        block: the encoder's `BlockConfig` (or a dict of its fields). The `MAPHead` takes its
            heads, MLP width, LayerNorm epsilon, GELU form and LayerNorm bias (`use_bias`), and
            `fc_norm` its epsilon and bias. Required with pooling="map"; without it, `fc_norm` has
            epsilon 1e-6 and a bias.
        fc_norm: a LayerNorm on the pooled features, as timm's `fc_norm` for models whose encoder
            has no final LayerNorm.
        kernel_initializer: the classifier's kernel initializer. The default suits training from
            scratch; "zeros" is the paper's new head for fine-tuning (§3.2), which is what
            `keras_vit.load(..., num_classes=N)` and the fine-tuning recipe use; from scratch a
            zero head trains markedly slower (docs/training.md).

    Input: (B, T, D), and optionally `token_mask` (B, T), False for the padding tokens of patch
    sequences (`keras_vit.naflex`), which "gap" and "map" leave out. Output: (B, C), or (B, R or D)
    when `num_classes=0`; with pooling="none", (B, N, C or R or D) for the N = T - num_prefix_tokens
    patch tokens, padding included.
    """

    def __init__(self, num_classes, pooling="token", representation_size=None, num_prefix_tokens=1, block=None,
                 fc_norm=False, kernel_initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        if pooling not in POOLING_MODES:
            raise ValueError(f"pooling={pooling!r} is not a pooling mode; use one of {POOLING_MODES}")
        if pooling == "map" and block is None:
            raise ValueError('pooling="map" needs block=, the encoder\'s BlockConfig (its num_heads and mlp_dim '
                             "are the MAP head's)")
        self.num_classes = int(num_classes)
        self.pooling = pooling
        self.representation_size = None if representation_size is None else int(representation_size)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.block = None if block is None else BlockConfig.from_options(block)
        self.fc_norm = bool(fc_norm)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        epsilon, bias = (1e-6, True) if self.block is None else (self.block.layer_norm_epsilon, self.block.use_bias)
        self.pool_norm = None
        if self.fc_norm:
            self.pool_norm = LayerNormalization(epsilon=epsilon, center=bias, dtype=self.dtype_policy, name="fc_norm")
        self.map_head = None
        if pooling == "map":
            b = self.block
            self.map_head = MAPHead(b.num_heads, b.mlp_dim, b.layer_norm_epsilon, b.gelu_approximate, b.use_bias,
                                    dtype=self.dtype_policy, name="map_head")
        self.pre_logits = None
        if self.representation_size:
            self.pre_logits = keras.layers.Dense(
                self.representation_size, activation="tanh", dtype=self.dtype_policy, name="pre_logits"
            )
        self.classifier = None
        if self.num_classes:
            self.classifier = keras.layers.Dense(
                self.num_classes,
                kernel_initializer=self.kernel_initializer,
                bias_initializer="zeros",
                dtype=self.dtype_policy,
                name="classifier",
            )

    @classmethod
    def from_config(cls, config):
        # Files saved before the head took the encoder's BlockConfig give the MAP head's and fc_norm's
        # options one by one. num_heads and mlp_dim were None unless pooling="map"; fc_norm alone
        # reads only the epsilon and the bias, so 1 stands in for them.
        config = dict(config)
        flat = {k: config.pop(k) for k in _FLAT_OPTIONS if k in config}
        if flat and config.get("block") is None and (flat.get("num_heads") is not None or config.get("fc_norm")):
            config["block"] = BlockConfig(flat.get("num_heads") or 1, flat.get("mlp_dim") or 1,
                                          layer_norm_epsilon=flat.get("layer_norm_epsilon", 1e-6),
                                          gelu_approximate=flat.get("gelu_approximate", False),
                                          use_bias=flat.get("norm_bias", True))
        return cls(**config)

    def build(self, input_shape):
        shape = (input_shape[0], input_shape[-1])
        if self.map_head is not None:
            self.map_head.build((input_shape[0], None, input_shape[-1]))
        if self.pool_norm is not None:
            self.pool_norm.build(shape)
        if self.pre_logits is not None:
            self.pre_logits.build(shape)
            shape = (input_shape[0], self.representation_size)
        if self.classifier is not None:
            self.classifier.build(shape)

    def pool(self, x, token_mask=None):
        """(B, T, D) -> (B, D); (B, T, D) -> (B, N, D) with pooling="none"."""
        p = self.num_prefix_tokens
        if self.pooling == "token":
            return x[:, 0]
        if self.pooling == "map":
            return self.map_head(x[:, p:], token_mask=None if token_mask is None else token_mask[:, p:])  # -> (B, D)
        if self.pooling == "none":
            return x[:, p:]
        if token_mask is None:
            return ops.mean(x[:, p:], axis=1)
        weights = ops.cast(token_mask[:, p:, None], x.dtype)  # (B, N, 1)
        return ops.sum(x[:, p:] * weights, axis=1) / ops.maximum(ops.sum(weights, axis=1), 1.0)  # masked mean

    def features(self, x, token_mask=None):
        """(B, T, D) -> what the classifier takes: the pooled, normed and pre-logits features (B, R or D)."""
        x = self.pool(x, token_mask)
        if self.pool_norm is not None:
            x = self.pool_norm(x)  # (B, D), timm's fc_norm
        if self.pre_logits is not None:
            x = self.pre_logits(x)  # (B, D) -> (B, R)
        return x

    def call(self, x, token_mask=None):
        x = self.features(x, token_mask)
        if self.classifier is not None:
            x = self.classifier(x)  # (B, R or D) -> (B, C)
        return x

    def compute_output_shape(self, input_shape):
        tokens = (() if self.pooling != "none"
                  else (None if input_shape[1] is None else input_shape[1] - self.num_prefix_tokens,))
        return (input_shape[0], *tokens, self.num_classes or self.representation_size or input_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update(
            num_classes=self.num_classes,
            pooling=self.pooling,
            representation_size=self.representation_size,
            num_prefix_tokens=self.num_prefix_tokens,
            block=None if self.block is None else dataclasses.asdict(self.block),
            fc_norm=self.fc_norm,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
        )
        return config
