"""The routing benchmark's command line: its flags, their defaults, and the checks made before
anything starts (``--apiserver-profile``'s directory exists, ``--profile`` has py-spy).

It measures nothing and starts nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import routing
from routing.baseline import RAW_STATUSES


def build_parser() -> argparse.ArgumentParser:
    """The flags; the description is the benchmark's first docstring line (``routing``'s)."""
    parser = argparse.ArgumentParser(description=(routing.__doc__ or "").split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--runners", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=10, help="slots per runner (pool and report)")
    parser.add_argument("--qps", type=float, default=200.0, help="the operator's HELMHIVE_ROUTING_QPS (its default)")
    parser.add_argument("--burst", type=int, default=400, help="the operator's HELMHIVE_ROUTING_BURST (its default)")
    parser.add_argument("--rate", type=float, default=0.0, help="create jobs at this steady rate per second (0: burst)")
    parser.add_argument("--writers", type=int, default=8, help="requests in flight for the raw patch rate")
    parser.add_argument("--raw-seconds", type=float, default=20.0)
    parser.add_argument(
        "--raw-warmup", type=float, default=10.0, help="seconds of untimed tiny patches before the raw rate"
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for every assignment")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--decide-only", action="store_true", help="only time decide_route (no cluster)")
    parser.add_argument("--idle-seconds", type=float, default=0.0, help="then measure operator CPU at rest")
    parser.add_argument("--restart", action="store_true", help="then restart the operator and time its recovery")
    parser.add_argument(
        "--backlog",
        action="store_true",
        help="create every job with the operator stopped, then start it (times routing alone)",
    )
    parser.add_argument("--profile", type=Path, help="py-spy the operator during the burst into this raw-stacks file")
    parser.add_argument(
        "--apiserver-profile",
        type=Path,
        help="serve the API server's pprof and write its CPU profile of each raw phase into this directory",
    )
    parser.add_argument("--raw-only", action="store_true", help="only the raw write phases (no operator, no burst)")
    parser.add_argument(
        "--raw-status",
        choices=RAW_STATUSES,
        default="router",
        help="the status the like-for-like raw phases write (the router's, or a smaller one to bound the gain)",
    )
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags of ``argv`` (else the command line's), checked; the ``--apiserver-profile`` directory made."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.apiserver_profile:
        args.apiserver_profile.mkdir(parents=True, exist_ok=True)
    if args.profile and not (Path(sys.executable).parent / "py-spy").exists():
        parser.error("--profile needs py-spy in this environment (make venv installs it with the dev extras)")
    return args
