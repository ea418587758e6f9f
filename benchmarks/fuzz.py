"""A long fuzz run: every test in ``tests/fuzz`` with many more inputs, and the counts to publish.

    .venv/bin/python benchmarks/fuzz.py --scale 10 --seed 12345 [--only validate] [-- PYTEST ARGS]

``--scale`` multiplies each test's CI count (``HELMHIVE_FUZZ_SCALE``); ``--seed`` switches from
the derandomized CI inputs to random ones from that seed (``HELMHIVE_FUZZ_SEED`` and
``--hypothesis-seed``), printed so a failure can be replayed with the same two options. The
tests that need the local control plane start it as the suite does (``tests/harness``).

At the end it prints, per test, the inputs tried, refused, accepted and any other count the
test keeps (disagreements, exceptions), summed over the run, and the commit it measured: the
figures ``docs/reliability.md`` records.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=10.0, help="multiply every test's CI example count")
    parser.add_argument("--seed", type=int, default=None, help="random inputs from this seed (default: a new one)")
    parser.add_argument("--only", default="", help="a pytest -k expression selecting some fuzz tests")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "tests/fuzz", "operator", "runner"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    print(f"fuzz: commit {commit}{' (with local changes)' if dirty else ''}, scale {args.scale:g}, seed {seed}")
    print(f"fuzz: replay with: {sys.executable} benchmarks/fuzz.py --scale {args.scale:g} --seed {seed}")
    with tempfile.TemporaryDirectory(prefix="helmhive-fuzz-") as tmp:
        report = Path(tmp) / "counts.jsonl"
        env = {
            **os.environ,
            "HELMHIVE_FUZZ_SCALE": str(args.scale),
            "HELMHIVE_FUZZ_SEED": str(seed),
            "HELMHIVE_FUZZ_REPORT": str(report),
        }
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "tests/fuzz",
            "-q",
            "-p",
            "no:logging",
            f"--hypothesis-seed={seed}",
            "-o",
            "timeout=7200",
            *(["-k", args.only] if args.only else []),
            *args.pytest_args,
        ]
        print("fuzz: running", " ".join(command[1:]), flush=True)
        started = time.monotonic()
        code = subprocess.run(command, cwd=REPO, env=env, check=False).returncode
        elapsed = time.monotonic() - started
        totals: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        if report.exists():
            for line in report.read_text(encoding="utf-8").splitlines():
                record = json.loads(line)
                test = record.pop("test")
                for key, value in record.items():
                    totals[test][key] += int(value)
    print(f"\nfuzz: pytest exited {code} after {elapsed:.0f} s (commit {commit}, scale {args.scale:g}, seed {seed})")
    for test, counts in totals.items():
        print(f"  {test}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    print(f"  inputs tried in all: {sum(c.get('tried', 0) for c in totals.values())}")
    return code


if __name__ == "__main__":
    sys.exit(main())
