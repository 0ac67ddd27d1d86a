"""The test suite: one package per area (docs/testing.md lists them). Tests import their helpers as
`tests.AREA.MODULE`, the tiny-model helpers as `tests.conftest` and the checkout's root as
`tests.ROOT`."""

import pathlib

# The checkout: the tests read its docs, checkpoints and results, and start their subprocesses in it.
ROOT = pathlib.Path(__file__).resolve().parent.parent
