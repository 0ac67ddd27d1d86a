"""The accuracy and science studies whose figures the docs quote, each a command: `python -m
experiments.NAME --help` (a study of several modules is a folder: `experiments.explain`,
`experiments.ood`). Their records are in experiments/results/.

No study imports another: what several of them share is in `experiments.common`, and the rest in
the library, `training` or the benchmark harness's CPU description (`benchmarks.cpu`). The
performance studies are in `benchmarks.studies`.
"""
