"""``helmhive-jobpod``: the programs of a job pod (``shim``, ``agent``) and the runner's ``attach`` bridge.

argparse, not Typer: these start once per job (``attach`` once per agent process, in the
adapter's spawn path), must start fast, and ``attach`` takes the agent's argv verbatim after ``--``.
Every default is the fixed contract of :mod:`helmhive.api.jobpod`; the options exist so tests
run the programs as local processes with their own directories and free ports.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from helmhive.api import jobpod
from helmhive.runner.jobpod.relay import parse_address

__all__ = ["POD_NAME_ENV", "main"]

POD_NAME_ENV = "HELMHIVE_POD_NAME"


def _address(text: str) -> str:
    try:
        parse_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="helmhive-jobpod", description="The programs of a Helmhive job pod.")
    commands = parser.add_subparsers(dest="command", required=True)

    shim = commands.add_parser("shim", help="the trusted end of the job pod: serve the runner's link")
    shim.add_argument("--host", default=None, help="address to listen on (default: every address)")
    shim.add_argument("--port", type=int, default=jobpod.LINK_PORT)
    shim.add_argument("--egress-port", type=int, default=jobpod.EGRESS_RELAY_PORT)
    shim.add_argument("--key-file", type=Path, default=Path(jobpod.LINK_KEY_PATH))
    shim.add_argument("--socket", type=Path, default=Path(jobpod.LINK_SOCKET))
    shim.add_argument("--job-root", type=Path, default=Path(jobpod.JOB_ROOT))
    shim.add_argument("--shim-dir", type=Path, default=Path(jobpod.SHIM_DIR))
    shim.add_argument("--pod", default=None, help=f"this pod's name (default: ${POD_NAME_ENV})")
    shim.add_argument("--auth-timeout", type=float, default=30.0)
    shim.add_argument("--launcher-timeout", type=float, default=120.0)

    agent = commands.add_parser("agent", help="the launcher: start the agent the runner sends, relay its stdio")
    agent.add_argument("--socket", type=Path, default=Path(jobpod.LINK_SOCKET))
    agent.add_argument("--connect-timeout", type=float, default=300.0)

    attach = commands.add_parser(
        "attach",
        help="run an agent in a job pod as if it were local (its environment is this process's)",
        usage="helmhive-jobpod attach --address HOST:PORT --pod NAME --key-file F --job-uid UID --cwd DIR "
        "[--egress-target HOST:PORT] [--timeout S] -- ARGV...",
    )
    attach.add_argument("--address", type=_address, required=True)
    attach.add_argument("--pod", required=True)
    attach.add_argument("--key-file", type=Path, required=True)
    attach.add_argument("--job-uid", required=True)
    attach.add_argument("--cwd", required=True)
    attach.add_argument("--egress-target", type=_address, default=None)
    attach.add_argument("--timeout", type=float, default=30.0)
    attach.add_argument("argv", nargs=argparse.REMAINDER)
    return parser


def _logging() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s")


def _shim(args: argparse.Namespace) -> int:
    # Each command imports only what it runs: ``attach`` starts in every agent spawn.
    from helmhive.runner.jobpod.auth import read_key  # noqa: PLC0415
    from helmhive.runner.jobpod.frames import LinkError  # noqa: PLC0415
    from helmhive.runner.jobpod.shim import ShimConfig, run_shim  # noqa: PLC0415

    pod = args.pod or os.environ.get(POD_NAME_ENV, "")
    if not pod:
        sys.stderr.write(f"helmhive-jobpod shim: no pod name (--pod or ${POD_NAME_ENV})\n")
        return 2
    try:
        key = read_key(args.key_file)
    except LinkError as exc:
        sys.stderr.write(f"helmhive-jobpod shim: {exc}\n")
        return 2
    config = ShimConfig(
        pod=pod,
        key=key,
        key_path=args.key_file.absolute(),
        host=args.host,
        port=args.port,
        egress_port=args.egress_port,
        socket_path=args.socket.absolute(),
        job_root=args.job_root.absolute(),
        shim_dir=args.shim_dir.absolute(),
        auth_timeout=args.auth_timeout,
        launcher_timeout=args.launcher_timeout,
    )
    return run_shim(config)


def _attach(args: argparse.Namespace) -> int:
    from helmhive.runner.jobpod.bridge import AttachOptions, run_attach  # noqa: PLC0415

    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        sys.stderr.write("helmhive-jobpod attach: no agent command after --\n")
        return 2
    options = AttachOptions(
        address=args.address,
        pod=args.pod,
        key_file=args.key_file,
        job_uid=args.job_uid,
        cwd=args.cwd,
        argv=tuple(argv),
        egress_target=args.egress_target,
        timeout=args.timeout,
    )
    return run_attach(options)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "shim":
        _logging()
        return _shim(args)
    if args.command == "agent":
        from helmhive.runner.jobpod.launcher import run_launcher  # noqa: PLC0415

        _logging()
        return run_launcher(args.socket, args.connect_timeout)
    return _attach(args)  # no logging: the bridge's stderr is the agent's


if __name__ == "__main__":
    raise SystemExit(main())
