"""What the repository's command-line tools share (`python -m training.train`, `apps.demo`,
`benchmarks.run`, the experiments): help texts and one-line errors (`cli`), the checks that run
before any deep-learning library loads (`preflight`), and the memory allocator (`malloc`).

Nothing here imports Keras, TensorFlow, JAX or torch at import time, and nothing imports
`training` or `apps`: both of those import this package.
"""
