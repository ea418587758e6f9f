"""``helmhive runner run``: the runner program of a runner pod.

It is configured by environment and mounted files only (see ``docs/runner-program.md``); this
module hands over to :func:`helmhive.runner.program.process.run_program`, which reads them, sets up JSON
logging and SIGTERM handling, runs :class:`helmhive.runner.program.main.RunnerProcess` and stops every
thread it started before the process exits. Imports of the runner happen inside the command, so
other ``helmhive`` commands never load the Kubernetes client for it.
"""

from __future__ import annotations

import os

import typer

app = typer.Typer(no_args_is_help=True, help="The runner program of a runner pod.")


@app.command()
def run() -> None:
    """Register this runner, keep its Lease, report, and run its adapter until SIGTERM or revocation."""
    from helmhive.runner.program.process import run_program  # noqa: PLC0415

    raise typer.Exit(run_program(os.environ))
