"""Runs the checkpoint parity tests on each backend and prints the measured errors as a table.

Each parity assertion logs max |keras_vit - reference| / max |reference| (see
tests/checkpoints/checkpoint_oracles.py); this script collects them. Usage:
`python scripts/checkpoint_parity.py [--backends tensorflow jax torch] [--tests FILE ...]` (about 3
minutes a backend on 2 CPU cores).
"""

import argparse
import collections
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="+", default=["tensorflow", "jax", "torch"],
                        help="Keras backends to compare (default: tensorflow jax torch)")
    parser.add_argument("--tests", nargs="+", help="test files (default: tests/checkpoints/test_checkpoints_*.py)")
    args = parser.parse_args()
    errors = collections.defaultdict(dict)  # case -> backend -> max relative error
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends:
            log = pathlib.Path(tmp) / f"{backend}.tsv"
            env = dict(os.environ, KERAS_BACKEND=backend, KERAS_VIT_PARITY_LOG=str(log))
            tests = args.tests or sorted(str(p) for p in (ROOT / "tests" / "checkpoints").glob("test_checkpoints_*.py"))
            cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests]
            failed |= subprocess.run(cmd, cwd=ROOT, env=env).returncode != 0
            for line in log.read_text().splitlines() if log.exists() else []:
                _, case, err = line.split("\t")
                errors[case][backend] = max(float(err), errors[case].get(backend, 0.0))
    print("| case | " + " | ".join(args.backends) + " |")
    print("|---|" + "---|" * len(args.backends))
    for case in sorted(errors):
        cells = [f"{errors[case][b]:.1e}" if b in errors[case] else "-" for b in args.backends]
        print(f"| {case} | " + " | ".join(cells) + " |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
