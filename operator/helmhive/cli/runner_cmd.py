"""``helmhive runner run``: the runner program of a runner pod.

It is configured by environment and mounted files only (see ``docs/runner-program.md``); this
module reads them, sets up JSON logging and SIGTERM handling, and hands over to
:class:`helmhive.runner.main.RunnerProcess`. Imports of the runner happen inside the command, so
other ``helmhive`` commands never load the Kubernetes client for it.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True, help="The runner program of a runner pod.")


@app.command()
def run() -> None:
    """Register this runner, keep its Lease, report, and run its adapter until SIGTERM or revocation."""
    import asyncio  # noqa: PLC0415
    import logging  # noqa: PLC0415
    import signal  # noqa: PLC0415

    from helmhive.runner.config import ConfigError, load_config  # noqa: PLC0415
    from helmhive.runner.jobs import cluster_jobs  # noqa: PLC0415
    from helmhive.runner.kube import RunnerKube, load_api_client  # noqa: PLC0415
    from helmhive.runner.logs import configure_logging, fields  # noqa: PLC0415
    from helmhive.runner.main import ExitCode, RunnerProcess, SystemClock  # noqa: PLC0415
    from helmhive.runner.metrics import STATE, serve_metrics  # noqa: PLC0415

    formatter = configure_logging(
        level=logging.DEBUG if os.environ.get("HELMHIVE_RUNNER_DEBUG") == "1" else logging.INFO
    )
    log = logging.getLogger("helmhive.runner")
    try:
        config = load_config(environ=os.environ, read_text=lambda path: Path(path).read_text(encoding="utf-8"))
    except ConfigError as exc:
        log.error("invalid configuration", extra=fields(problems=exc.problems))
        raise typer.Exit(ExitCode.CONFIG) from None
    serve_metrics(addr=config.env.metrics_addr, port=config.env.metrics_port)

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        api = load_api_client(str(config.env.kubeconfig) if config.env.kubeconfig else None)
        kube = RunnerKube(api, namespace=config.env.namespace)
        try:
            process = RunnerProcess(
                config=config,
                kube=kube,
                clock=SystemClock(),
                stop=stop,
                on_secrets=formatter.add_secrets,
                jobs_factory=cluster_jobs,
            )
            STATE.bind(process)
            return await process.run()
        finally:
            kube.close()

    code = asyncio.run(main())
    raise typer.Exit(code)
