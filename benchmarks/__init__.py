"""Throughput benchmarks of keras_vit against timm and keras-hub: `python -m benchmarks.run [--quick]`.

The driver (`run`) starts one long-lived worker process per Keras backend (`worker`), since
KERAS_BACKEND is fixed at import, and times the candidates of each case one repetition at a time
in turn (A B C C B A ...), so that a change in the machine's load hits every candidate alike.
"""
