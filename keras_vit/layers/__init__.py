"""Public Keras layers of keras_vit, each registered for `.keras` serialization."""

from keras_vit.layers.attention import Attention
from keras_vit.layers.embedding import ClassToken, PatchEmbedding, RegisterTokens
from keras_vit.layers.map_head import MAPHead
from keras_vit.layers.normalization import LayerNormalization
from keras_vit.layers.heads import POOLING_MODES, ClassifierHead
from keras_vit.layers.position_embedding import POSITION_EMBEDDING_KINDS, PositionEmbedding, sincos_2d
from keras_vit.layers.pyramid import SimpleFeaturePyramid
from keras_vit.layers.resample import RESAMPLE_METHODS, resample_position_embedding
from keras_vit.layers.resnet import ResNetStem, StdConv2D
from keras_vit.layers.transformer import BlockConfig, Encoder, LayerScale, ParallelTransformerBlock, TransformerBlock

__all__ = [
    "Attention",
    "BlockConfig",
    "MAPHead",
    "RegisterTokens",
    "ResNetStem",
    "StdConv2D",
    "ClassToken",
    "ClassifierHead",
    "Encoder",
    "LayerNormalization",
    "LayerScale",
    "POOLING_MODES",
    "POSITION_EMBEDDING_KINDS",
    "ParallelTransformerBlock",
    "PatchEmbedding",
    "PositionEmbedding",
    "RESAMPLE_METHODS",
    "SimpleFeaturePyramid",
    "TransformerBlock",
    "resample_position_embedding",
    "sincos_2d",
]
