"""Every command-line tool's --help: each option has a help text that states its default."""

import concurrent.futures
import os
import re
import subprocess
import sys

import pytest
from tests import ROOT

CLIS = [
    "apps.demo", "scripts.app_screenshots", "training.train", "training.evaluate", "training.export_checkpoint",
    "experiments.data_scale", "training.ood_stats", "experiments.ood", "experiments.ood.far_shift",
    "experiments.best_epoch", "experiments.naflex_aspect",
    "benchmarks.run", "benchmarks.report", "benchmarks.studies.breakdown", "benchmarks.studies.train_breakdown",
    "benchmarks.studies.jax_profile", "benchmarks.worker", "benchmarks.studies.attention_mask",
    "benchmarks.studies.gpu_fit", "benchmarks.studies.gpu_attention", "benchmarks.studies.xla_cpu_bf16",
    "benchmarks.studies.torch_bf16_profile",
]  # fmt: skip


def help_entries(text):
    """{invocation: help text} of every argument in an argparse --help text."""
    entries, name = {}, None
    for line in text.splitlines():
        if re.match(r"^  \S", line):  # "  --flag METAVAR   help..." or "  positional"
            name, _, rest = line[2:].partition("  ")
            entries[name] = rest.strip()
        elif name is not None and re.match(r"^   +\S", line):
            entries[name] += " " + line.strip()
        else:
            name = None
    return entries


def test_help_entries_finds_a_missing_help():
    text = "usage: x\n\noptions:\n  -h, --help  show this help\n  --port PORT\n  --host HOST  where\n"
    assert help_entries(text) == {"-h, --help": "show this help", "--port PORT": "", "--host HOST": "where"}


def run_help(module):
    env = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    return module, out


@pytest.mark.slow
def test_every_cli_option_has_help_with_its_default():
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run_help, CLIS))
    problems = []
    for module, out in results:
        if out.returncode != 0:
            problems.append(f"{module} --help failed: {out.stderr[-500:]}")
            continue
        if out.stderr.strip():
            problems.append(f"{module} --help printed to stderr: {out.stderr[:300]!r}")
        entries = help_entries(out.stdout)
        assert entries, f"{module}: no options found in {out.stdout!r}"
        for name, text in entries.items():
            if not text:
                problems.append(f"{module} {name}: no help text")
            elif name.startswith("-") and "--help" not in name and "default" not in text:
                problems.append(f"{module} {name}: no default in {text!r}")
    assert not problems, "\n".join(problems)
