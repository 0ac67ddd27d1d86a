"""Experiments that reproduce the seed notes' results with keras_vit."""
