"""The "What the model learned" tab: the paper's Figure 7 (center, right) for the served model,
from `keras_vit.explain`."""

import gradio as gr
import numpy as np

import keras_vit
from apps import plots
from keras_vit.io.images import open_image
from apps.preprocess import model_pixels

ANALYSIS_IMAGES = 8


def learned_tab(predictor, examples):
    """Position-embedding similarity and mean attention distance, over the first example images
    (or random noise when there are none). Layers and heads are numbered from 1."""
    model = predictor.model
    paths = examples[:ANALYSIS_IMAGES]
    if paths:
        pixels = np.stack([model_pixels(open_image(p), model.image_size, model.num_channels, True) for p in paths])
        source = f"{len(paths)} example images"
    else:
        rng = np.random.default_rng(0)
        pixels = rng.integers(0, 256, (ANALYSIS_IMAGES, *model.image_size, model.num_channels), dtype="uint8")
        source = f"{ANALYSIS_IMAGES} random-noise images (no examples were given)"
    distance = predictor.attention_distance(pixels)
    gr.Markdown(
        "Left: cosine similarity between the learned position embeddings; tile (i, j) compares patch "
        "(i, j) with every patch. Right: for each head, the average image distance between a query patch "
        f"and the patches it attends to, weighted by attention, over {source} (the paper's Figure 7)."
    )
    with gr.Row():
        gr.Plot(plots.position_similarity_figure(keras_vit.position_embedding_similarity(model)), label="Position embeddings")
        gr.Plot(plots.attention_distance_figure(distance, model.image_size), label="Attention distance")
