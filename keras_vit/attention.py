"""Attention maps and attention rollout.

Shapes: B batch, L layers, K heads, T tokens (prefix + h * w patches), (h, w) token grid.

Both functions re-run the encoder with `return_attention_scores=True`, so the normal forward pass
keeps the fused attention kernel and pays nothing for them. They use only `keras.ops`, so they run
on every backend and inside `jax.jit` or `tf.function`.
"""

from keras import ops


def attention_maps(model, images):
    """Attention probabilities of every layer and head, (B, L, K, T, T), as a backend tensor.

    Args:
        model: a `keras_vit.ViT`.
        images: (B, H, W, C), normalized as the model expects.
    """
    _, scores = model.forward_features(images, training=False, return_attention_scores=True)
    return ops.stack(scores, axis=1)  # L x (B, K, T, T) -> (B, L, K, T, T)


def attention_rollout(model, images, maps=None):
    """Attention rollout (Abnar & Zuidema, 2020) on the patch grid, (B, h, w).

    Each layer's attention is averaged over heads, the identity is added for the residual path,
    rows are renormalized, and the layers are multiplied from first to last. The result is the
    class token's row, or for models without one the mean of the patch rows.

    Args:
        model: a `keras_vit.ViT`.
        images: (B, H, W, C), normalized as the model expects.
        maps: precomputed `attention_maps(model, images)`, to avoid a second forward pass.
    """
    maps = attention_maps(model, images) if maps is None else maps
    a = ops.mean(ops.cast(maps, "float32"), axis=2)  # (B, L, K, T, T) -> (B, L, T, T)
    a = a + ops.eye(a.shape[-1], dtype=a.dtype)
    a = a / ops.sum(a, axis=-1, keepdims=True)
    rollout = a[:, 0]
    for layer in range(1, a.shape[1]):
        rollout = ops.matmul(a[:, layer], rollout)  # (B, T, T) x (B, T, T) -> (B, T, T)
    p = model.num_prefix_tokens
    if model.class_token:
        patches = rollout[:, 0, p:]  # (B, N)
    else:
        patches = ops.mean(rollout[:, p:, p:], axis=1)  # (B, N, N) -> (B, N)
    return ops.reshape(patches, (-1, *model.grid_size))  # (B, N) -> (B, h, w)
