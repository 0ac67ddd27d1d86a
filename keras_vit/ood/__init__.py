"""Out-of-domain scores: how unlike a classifier's training data an image is.

A classifier gives every image one of its classes, often with high confidence, a cat photo
included. These scores flag such images; each is larger for an image further from the training
data:

- "msp": 1 - the maximum softmax probability (Hendrycks & Gimpel, ICLR 2017).
- "energy": the negative log-sum-exp of the logits (Liu et al., NeurIPS 2020).
- "mahalanobis": the squared Mahalanobis distance to the nearest class mean, under one covariance
  shared by the classes (Lee et al., NeurIPS 2018).
- "rmds": relative Mahalanobis: that distance less the distance to the mean of all training
  features under their own covariance (Ren et al., 2021).
- "vim": virtual logit matching: the norm of the features' part outside the principal subspace of
  the training features, scaled to the logits, against the log-sum-exp of the logits (Wang et al.,
  CVPR 2022). Pooled features only: it reads the classifier's weights.
- "knn": the distance of the L2-normalized features to their k-th nearest training feature (Sun et
  al., ICML 2022).

The feature-space scores read the mean output token of chosen encoder blocks and/or the pooled
features that the classifier takes, and sum the score over these feature sets (`block_choice`). `fit` computes what they
need from training images in one call; `with_threshold` sets the threshold on held-out in-domain
images and keeps their scores, so that an image's score is also a percentile of them. `python -m
experiments.ood` measures every score on near and far shifts (docs/app.md, "Out-of-domain warning"),
and DEFAULT_METHOD comes from its table.

The statistics are stored beside a checkpoint as `ood.npz` (`stats_path`): the training CLI writes
it, and `load_for` finds it for a checkpoint, so an application can warn:

    stats = keras_vit.ood.load_for("run/model.keras", model)   # None when there is none
    if stats is not None:
        verdict = keras_vit.ood.check(model, pixels, stats)    # .score, .percentile, .unusual
        print(verdict.message(0))   # "This image is less like the training images than 99.8% of ..."

Three modules: `scores` (the statistics and the scores' arithmetic, NumPy only), `features` (the
features of one pass of the model) and `stats_file` (the `ood.npz` format). Every public name is
importable from `keras_vit.ood`.
"""

from keras_vit.ood.features import block_choice, check, classifier_weights, feature_width, features, fit, score
from keras_vit.ood.scores import (BLOCK_WORDS, DEFAULT_BLOCKS, DEFAULT_METHOD, KNN_BANK, KNN_NEIGHBOURS, LOGIT_METHODS,
                                  METHODS, POOLED, Stats, Verdict, check_method, describe, fit_features, parse_blocks,
                                  scores, with_threshold)
from keras_vit.ood.stats_file import (ARRAYS, FILENAME, FORMAT, MAX_FILE_BYTES, MAX_OFF_CHARS, load, load_for, save,
                                      stats_path)

__all__ = ["ARRAYS", "BLOCK_WORDS", "DEFAULT_BLOCKS", "DEFAULT_METHOD", "FILENAME", "FORMAT", "KNN_BANK",
           "KNN_NEIGHBOURS", "LOGIT_METHODS", "MAX_FILE_BYTES", "MAX_OFF_CHARS", "METHODS", "POOLED", "Stats",
           "Verdict", "block_choice", "check", "check_method", "classifier_weights", "describe", "feature_width",
           "features", "fit", "fit_features", "load", "load_for", "parse_blocks", "save", "score", "scores",
           "stats_path", "with_threshold"]
