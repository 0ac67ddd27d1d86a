"""Performance studies whose figures the docs quote (where time and memory go), each a command:
`python -m benchmarks.studies.NAME --help`.

They build on the harness (`benchmarks.cases`, `impls`, `models`, `cpu`) and time with
`benchmarks.timing`; the harness imports nothing from here, and no study imports another. The
accuracy and science studies are in experiments/.
"""
