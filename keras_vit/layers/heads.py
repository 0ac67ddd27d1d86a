"""Classification heads: pooling, the optional tanh pre-logits layer and the classifier (§3.1).

Shapes: B batch, T tokens, D model width, R representation size, C classes.
"""

import keras
from keras import ops

POOLING_MODES = ("token", "gap")


@keras.saving.register_keras_serializable(package="keras_vit")
class ClassifierHead(keras.layers.Layer):
    """Reads an image representation from the encoder output and classifies it.

    Args:
        num_classes: C. 0 returns the pooled features instead of logits.
        pooling: "token" reads the class token (row 0); "gap" averages the patch tokens (the rows
            after the `num_prefix_tokens` prefix).
        representation_size: R for a Dense + tanh pre-logits layer, as in the paper's pre-training
            head, or None.
        num_prefix_tokens: tokens before the patch grid.

    The classifier is initialized to zero, as the paper does for fine-tuning heads (§3.1).

    Input: (B, T, D). Output: (B, C), or (B, R or D) when `num_classes=0`.
    """

    def __init__(self, num_classes, pooling="token", representation_size=None, num_prefix_tokens=1, **kwargs):
        super().__init__(**kwargs)
        if pooling not in POOLING_MODES:
            raise ValueError(f"pooling={pooling!r} is not a pooling mode; use one of {POOLING_MODES}")
        if pooling == "token" and num_prefix_tokens < 1:
            raise ValueError('pooling="token" needs a class token, but num_prefix_tokens=0')
        self.num_classes = int(num_classes)
        self.pooling = pooling
        self.representation_size = None if representation_size is None else int(representation_size)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.pre_logits = None
        if self.representation_size:
            self.pre_logits = keras.layers.Dense(
                self.representation_size, activation="tanh", dtype=self.dtype_policy, name="pre_logits"
            )
        self.classifier = None
        if self.num_classes:
            self.classifier = keras.layers.Dense(
                self.num_classes,
                kernel_initializer="zeros",
                bias_initializer="zeros",
                dtype=self.dtype_policy,
                name="classifier",
            )

    def build(self, input_shape):
        shape = (input_shape[0], input_shape[-1])
        if self.pre_logits is not None:
            self.pre_logits.build(shape)
            shape = (input_shape[0], self.representation_size)
        if self.classifier is not None:
            self.classifier.build(shape)

    def pool(self, x):
        """(B, T, D) -> (B, D)."""
        if self.pooling == "token":
            return x[:, 0]
        return ops.mean(x[:, self.num_prefix_tokens :], axis=1)

    def call(self, x):
        x = self.pool(x)
        if self.pre_logits is not None:
            x = self.pre_logits(x)  # (B, D) -> (B, R)
        if self.classifier is not None:
            x = self.classifier(x)  # (B, R or D) -> (B, C)
        return x

    def compute_output_shape(self, input_shape):
        if self.num_classes:
            return (input_shape[0], self.num_classes)
        return (input_shape[0], self.representation_size or input_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update(
            num_classes=self.num_classes,
            pooling=self.pooling,
            representation_size=self.representation_size,
            num_prefix_tokens=self.num_prefix_tokens,
        )
        return config
