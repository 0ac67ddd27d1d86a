"""The explanation study (`python -m experiments.explain`): how faithful each explanation is on the
shipped checkpoint (`methods`: the candidates and the perturbation test), and whether it points at
the right object where the evidence is known (`localization`)."""
