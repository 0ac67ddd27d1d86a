"""Throughput benchmarks of keras_vit against timm and keras-hub: `python -m benchmarks.run [--quick]`.

The driver (`run`) starts one long-lived worker process per Keras backend (`worker`), since
KERAS_BACKEND is fixed at import, and times the candidates of each case one repetition at a time
in turn (A B C C B A ...), so that a change in the machine's load hits every candidate alike.
`cases` says what is timed, `impls` and `models` build it, `report` renders the record, `cpu` names
the machine. `studies/` holds the studies that the docs quote, each its own command; they time in
one process with `timing`, in the same alternation.
"""
