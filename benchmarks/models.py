"""The three implementations of the same ViT: keras_vit, keras-hub's ViTBackbone plus a Dense head,
and timm's VisionTransformer."""

import keras


def keras_model(spec):
    """keras_vit.ViT or keras-hub ViTBackbone + head, in the spec's dtype policy."""
    m, dtype = spec["model"], spec.get("dtype", "float32")
    if spec["impl"] == "keras_hub":
        return hub_model(m, dtype)
    import keras_vit

    model = keras_vit.ViT(**m, dtype=dtype)
    if spec.get("variant") == "keras-layernorm":
        keras_layernorm(model)
    if spec.get("variant") == "keras-matmul":
        keras_matmul(model)
    if spec.get("variant") == "keras-attention":
        keras_attention(model)
    return model


def keras_attend(qkv, scale, mask=None):
    """The attention core as Keras writes it: `ops.dot_product_attention` of the split Q, K, V
    (`jax.nn.dot_product_attention` on JAX), in place of `keras_vit.layers.attention_core.attend`."""
    from keras import ops

    from keras_vit.layers.attention_core import split

    return ops.dot_product_attention(*split(qkv), scale=scale, mask=mask)


def keras_attention(model):
    """The attention core of every fused attention layer of `model` is `keras_attend` instead of
    `keras_vit.layers.attention_core.attend`."""
    from keras_vit.layers import Attention

    layers = [layer for layer in model._flatten_layers() if isinstance(layer, Attention)]
    for layer in layers:
        layer._attend = keras_attend
    if not layers:
        raise ValueError("the keras-attention variant found no keras_vit Attention layer in the model")


def keras_matmul(model):
    """Every product of `model` is Keras' own, with a bf16 result under a bf16 policy: its Dense
    layers compute as `keras.layers.Dense`, and its attention takes `MultiHeadAttention`'s path
    (one EinsumDense per projection) instead of keras_vit's fused one, whose products are
    `keras_vit.layers.dense.matmul`. The variables are untouched."""
    from keras_vit.layers import Attention
    from keras_vit.layers.dense import Dense

    layers = list(model._flatten_layers())
    for layer in layers:
        if isinstance(layer, Dense):
            layer.call = keras.layers.Dense.call.__get__(layer)
        elif isinstance(layer, Attention):
            layer._fused_path = lambda *args, **kwargs: False
    if not any(isinstance(layer, Dense) for layer in layers):
        raise ValueError("the keras-matmul variant found no keras_vit Dense layer in the model")


def keras_layernorm(model):
    """Every norm of `model` computes as Keras' own LayerNormalization (autodiff through `var` and
    `rsqrt` on JAX) instead of keras_vit's closed-form backward; the variables are untouched."""
    from keras_vit.layers import LayerNormalization

    norms = [layer for layer in model._flatten_layers() if isinstance(layer, LayerNormalization)]
    for layer in norms:
        layer.call = keras.layers.LayerNormalization.call.__get__(layer)
    if not norms:
        raise ValueError("the keras-layernorm variant found no keras_vit LayerNormalization in the model")


def hub_model(m, dtype):
    """ViTBackbone (class token, learned positions, like keras_vit) and a Dense classifier on the
    class token, so that both do the same work."""
    from keras_hub.models import ViTBackbone

    size, channels = m["image_size"], m.get("num_channels", 3)
    backbone = ViTBackbone(
        image_shape=(size, size, channels), patch_size=m["patch_size"], num_layers=m["num_layers"],
        num_heads=m["num_heads"], hidden_dim=m["hidden_dim"], mlp_dim=m["mlp_dim"], dtype=dtype,
    )
    inputs = keras.Input((size, size, channels))
    tokens = backbone(inputs)  # (B, T, D)
    logits = keras.layers.Dense(m["num_classes"], dtype=dtype)(tokens[:, 0])  # (B, D) -> (B, classes)
    return keras.Model(inputs, keras.ops.cast(logits, "float32"))


def timm_model(m):
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(
        img_size=m["image_size"], patch_size=m["patch_size"], in_chans=m.get("num_channels", 3),
        embed_dim=m["hidden_dim"], depth=m["num_layers"], num_heads=m["num_heads"],
        mlp_ratio=m["mlp_dim"] / m["hidden_dim"], num_classes=m["num_classes"],
        global_pool="avg" if m.get("pooling") == "gap" else "token",
        class_token=m.get("pooling", "token") == "token",
    )
