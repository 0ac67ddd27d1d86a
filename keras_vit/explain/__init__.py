"""Why a ViT gives its answer: attention maps and rollout (`maps`), the paper's Figure 7
(`figure7`), class relevance (`relevance`), and the backends' vector-Jacobian products that
relevance uses (`autodiff`)."""

from keras_vit.explain.figure7 import mean_attention_distance, position_embedding_similarity
from keras_vit.explain.maps import attention_maps, attention_rollout, attention_summary, head_logits
from keras_vit.explain.relevance import class_relevance

__all__ = ["attention_maps", "attention_rollout", "attention_summary", "class_relevance", "head_logits",
           "mean_attention_distance", "position_embedding_similarity"]
