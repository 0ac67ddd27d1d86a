"""Studies whose figures the docs quote, each a command: `python -m benchmarks.studies.NAME --help`.

They build on the harness (`benchmarks.cases`, `impls`, `models`, `cpu`) and time with
`benchmarks.timing`; the harness imports nothing from here.
"""
