"""The runner program as a process: its logging, signals, metrics server, main loop and exit.

``helmhive runner run`` (:mod:`helmhive.cli.runner_cmd`) calls :func:`run_program` and exits
with what it returns. This module owns the process around
:class:`~helmhive.runner.program.main.RunnerProcess`:

- :mod:`faulthandler` is on from the start, so a fatal signal (SIGSEGV, SIGABRT, SIGBUS, ...)
  while the runner runs prints every thread's Python stack to stderr, the runner's log;
- SIGTERM and SIGINT set the main loop's stop event;
- when the loop has returned, the metrics server is stopped and the last log line,
  ``runner exiting``, gives the exit code and the threads still running besides the main one.
  There should be none: the runner joins every thread it started (the watches, the metrics
  server, the event loop's executor). A thread still running while the interpreter finalizes
  can crash the process after a clean stop -- one reading from the API server over TLS while
  OpenSSL cleans up at ``exit()`` did (docs/runners.md, "Stopping") -- so if one is left
  anyway, :func:`exit_process` leaves with ``os._exit`` after flushing the log instead of
  finalizing the interpreter around it.
"""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

from helmhive.runner.config import ConfigError, load_config
from helmhive.runner.kube import RunnerKube, load_api_client
from helmhive.runner.logs import JsonFormatter, configure_logging, fields
from helmhive.runner.metrics import STATE, serve_metrics
from helmhive.runner.program.cluster_jobs import cluster_jobs
from helmhive.runner.program.main import ExitCode, RunnerProcess, SystemClock

__all__ = ["exit_process", "live_threads", "run_program"]

log = logging.getLogger("helmhive.runner")


def live_threads() -> list[str]:
    """The names of the threads running besides the main thread."""
    main = threading.main_thread()
    return sorted(thread.name for thread in threading.enumerate() if thread is not main and thread.is_alive())


def run_program(environ: Mapping[str, str]) -> int:
    """Run the runner until it stops; return its exit code (:class:`~helmhive.runner.program.main.ExitCode`).

    Returns only when no other thread is left (see :func:`exit_process`).
    """
    faulthandler.enable(file=sys.stderr, all_threads=True)
    formatter = configure_logging(level=logging.DEBUG if environ.get("HELMHIVE_RUNNER_DEBUG") == "1" else logging.INFO)
    code = _serve(environ, formatter)
    return exit_process(code, runner=environ.get("HELMHIVE_RUNNER_NAME"))


def _serve(environ: Mapping[str, str], formatter: JsonFormatter) -> int:
    try:
        config = load_config(environ=environ, read_text=lambda path: Path(path).read_text(encoding="utf-8"))
    except ConfigError as exc:
        log.error("invalid configuration", extra=fields(problems=exc.problems))
        return ExitCode.CONFIG
    metrics = serve_metrics(addr=config.env.metrics_addr, port=config.env.metrics_port)

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
            STATE.bind(None)
            kube.close()

    try:
        return asyncio.run(main())
    finally:
        if metrics is not None and not metrics.close():
            log.warning("the metrics server did not stop")


def exit_process(code: int, *, runner: str | None = None) -> int:
    """Log ``runner exiting`` with the threads still running; with none, return ``code`` for a normal exit.

    With any left, flush the log and leave with ``os._exit(code)``: the interpreter's
    finalization must not run around a thread that may still be inside OpenSSL or the C library.
    """
    threads = live_threads()
    log.log(
        logging.WARNING if threads else logging.INFO,
        "runner exiting",
        extra=fields(runner=runner, exitCode=int(code), threads=threads),
    )
    if not threads:
        return code
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)
