"""The "What the model learned" tab: the paper's Figure 7 (center, right) for the served model,
from `keras_vit.explain`, over the same example images as the Classify tab.

Figures are built with `matplotlib.figure.Figure`, not pyplot, so no global state is shared
between requests. They are drawn small (about 4.5 inches) with large text, so that they stay
readable when the page shows them 330 px wide on a phone.
"""

import gradio as gr
import numpy as np
from matplotlib.figure import Figure

import keras_vit
from keras_vit.io.images import open_image
from apps.images import model_pixels

ANALYSIS_IMAGES = 8
PLOT_MIN_WIDTH = 420  # px: narrower than two of these, the plots stack


def learned_tab(predictor, examples):
    """Position-embedding similarity, and the mean attention distance over the first example images
    (`examples`, an `apps.sources.Examples` or None; without examples that plot is left out and the
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
        gr.Plot(position_similarity_figure(keras_vit.position_embedding_similarity(model)),
                label="Position embeddings", show_label=False, min_width=PLOT_MIN_WIDTH, elem_id="position-plot")
        if distance is not None:
            gr.Plot(attention_distance_figure(distance, model.image_size), label="Attention distance",
                    show_label=False, min_width=PLOT_MIN_WIDTH, elem_id="distance-plot")


def position_similarity_figure(similarity):
    """(h, w, h, w) cosine similarities -> a figure with one (h, w) tile per patch, laid out as the
    patches are, so tile (i, j) shows how similar patch (i, j)'s embedding is to every other's."""
    h, w = similarity.shape[:2]
    pad = np.full((h, w, h + 1, w + 1), np.nan)
    pad[:, :, :h, :w] = similarity
    mosaic = pad.transpose(0, 2, 1, 3).reshape(h * (h + 1), w * (w + 1))  # (h, h+1, w, w+1) -> tiles
    fig = Figure(figsize=(4.6, 4.2))
    ax = fig.add_subplot()
    im = ax.imshow(mosaic, cmap="viridis", vmin=-1, vmax=1, interpolation="nearest")
    ax.set_title("Position embedding similarity")
    ax.set_xlabel("input patch column")
    ax.set_ylabel("input patch row")
    ax.set_xticks([(j + 0.5) * (w + 1) - 1 for j in range(w)], [str(j + 1) for j in range(w)])
    ax.set_yticks([(i + 0.5) * (h + 1) - 1 for i in range(h)], [str(i + 1) for i in range(h)])
    ax.tick_params(labelsize=9)
    fig.colorbar(im, ax=ax, label="cosine similarity")
    fig.tight_layout()
    return fig


def attention_distance_figure(distance, image_size):
    """(L, K) mean attention distances in pixels -> a scatter plot of each head against depth."""
    num_layers, num_heads = distance.shape
    fig = Figure(figsize=(4.6, 3.6))
    ax = fig.add_subplot()
    for k in range(num_heads):
        ax.scatter(np.arange(1, num_layers + 1), distance[:, k], s=14, label=f"head {k + 1}")
    ax.set_xlabel("network depth (layer)")
    ax.set_ylabel("mean attention distance (pixels)")
    ax.set_title("Mean attention distance")
    ax.set_ylim(0, max(image_size))
    ax.set_xticks(np.arange(1, num_layers + 1))
    if num_heads <= 16:
        ax.legend(fontsize=8, ncol=2, loc="lower right")
    fig.tight_layout()
    return fig
