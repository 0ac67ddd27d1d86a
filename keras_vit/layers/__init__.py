"""Public Keras layers of keras_vit, each registered for `.keras` serialization."""

from keras_vit.layers.embedding import ClassToken, PatchEmbedding
from keras_vit.layers.heads import POOLING_MODES, ClassifierHead
from keras_vit.layers.position_embedding import (
    POSITION_EMBEDDING_KINDS,
    RESAMPLE_METHODS,
    PositionEmbedding,
    resample_position_embedding,
    sincos_2d,
)
from keras_vit.layers.transformer import Encoder, LayerScale, TransformerBlock

__all__ = [
    "ClassToken",
    "ClassifierHead",
    "Encoder",
    "LayerScale",
    "POOLING_MODES",
    "POSITION_EMBEDDING_KINDS",
    "PatchEmbedding",
    "PositionEmbedding",
    "RESAMPLE_METHODS",
    "TransformerBlock",
    "resample_position_embedding",
    "sincos_2d",
]
