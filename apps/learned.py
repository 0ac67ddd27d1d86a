"""The "What the model learned" tab: the paper's Figure 7 (center, right) for the served model,
from `keras_vit.explain`, over the same example images as the Classify tab."""

import gradio as gr
import numpy as np

import keras_vit
from keras_vit.io.images import open_image
from apps import plots
from apps.preprocess import model_pixels

ANALYSIS_IMAGES = 8
PLOT_MIN_WIDTH = 420  # px: narrower than two of these, the plots stack


def learned_tab(predictor, examples):
    """Position-embedding similarity, and the mean attention distance over the first example images
    (`examples`, an `apps.examples.Examples` or None; without examples that plot is left out and the
    tab says why). Layers and heads are numbered from 1."""
    model = predictor.model
    text = ("**Position embeddings**: cosine similarity between the learned position embeddings; tile (i, j) "
            "compares patch (i, j) with every patch.")
    distance = None
    if examples:
        paths = examples.paths[:ANALYSIS_IMAGES]
        pixels = np.stack([model_pixels(open_image(p), model.image_size, model.num_channels, True) for p in paths])
        distance = predictor.attention_distance(pixels)
        text += ("\n\n**Attention distance**: for each head, the average image distance between a query patch and "
                 f"the patches it attends to, weighted by attention, over {len(paths)} example images from "
                 f"{examples.source} (the paper's Figure 7).")
    else:
        text += ("\n\n**Attention distance** needs images, and this model has no examples: pass `--examples DIR` "
                 "to draw it.")
    gr.Markdown(text, elem_classes=["explain"])
    with gr.Row():
        gr.Plot(plots.position_similarity_figure(keras_vit.position_embedding_similarity(model)),
                label="Position embeddings", show_label=False, min_width=PLOT_MIN_WIDTH, elem_id="position-plot")
        if distance is not None:
            gr.Plot(plots.attention_distance_figure(distance, model.image_size), label="Attention distance",
                    show_label=False, min_width=PLOT_MIN_WIDTH, elem_id="distance-plot")
