"""``helmhive explain-routing``: why a job was (or would be) routed where it was, from the live cluster.

    helmhive explain-routing JOB [-n NS]          an existing job
    helmhive explain-routing -f job.yaml [-n NS]  a dry run of a manifest
    ... [--output table|json] [--kubeconfig PATH]

Reads only (GET and LIST); it never writes anything. It gathers what the operator's router
sees — Runners and RunnerPools (all namespaces), the job's namespace labels, every AgentJob
(active jobs per runner are counted from them), MemoryRecords and SessionBindings — and calls
the same pure :func:`~helmhive.policy.routing.route.decide_route`. For an existing job it shows the
stored decision (``status.routing``, ``status.assignment``, conditions) next to a fresh one
for the runners as they are now, not counting the job against its own runner. For a manifest
it binds the profile in memory exactly as the queue step would.

This module owns the command: its options, the order of its steps and its exit codes. Reading
the manifest is :mod:`helmhive.cli.explain_manifest`'s, asking the cluster (bounded)
:mod:`helmhive.cli.explain_cluster`'s, printing :mod:`helmhive.cli.explain_output`'s; the
kubeconfig, the default namespace and the timeout are found as for every cluster command
(:mod:`helmhive.cli.kubeapi`).

Exit status: 0 when the (fresh) decision assigns a runner, 3 when the job would wait (for
capacity, or at queue time for a Workspace or Profile that does not exist yet), 1 when it fails
closed, 4 when the API server could not be reached, did not answer in time or answered that it
is unavailable (nothing is printed on stdout then), 2 for a usage error, a kubeconfig that cannot
be loaded, an unreadable or malformed job or manifest, a request the API server refused, or a
job that fails closed at queue time (an invalid spec, a profile that cannot be bound). With
``-o json`` every outcome (assigned, waiting, failing closed, at queue time too) is one JSON
object on stdout. No Kopf: the binding is the queue step's own
:func:`~helmhive.controller.jobs.binding.bind_profile`.

Timeout: ``$HELMHIVE_CLI_TIMEOUT_SECONDS`` (default 30), as for every cluster command, bounds
each API call (to connect, and each read); the command makes several calls, so it also bounds all
of them together: the command gives up once that many seconds have passed in all.

Bad input never prints a traceback: one line on stderr says what and, for a manifest, where
(``metadata: must be a mapping``, ``spec.jobKind: Input should be …``). Text that comes from
objects or files (names, messages, reasons, paths) is printed as plain text: rich markup in it is
never interpreted and terminal control characters are shown escaped (``\\x1b``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from helmhive.cli.explain_cluster import NoAnswer, ask
from helmhive.cli.explain_manifest import UsageError, manifest_namespace, read_manifest
from helmhive.cli.explain_output import Explanation, QueueStop, build_console, render_explanation
from helmhive.cli.kubeapi import (
    TIMEOUT_ENV,
    KubeconfigError,
    PrintFormat,
    context_namespace,
    decide_timeout,
    load_api_client,
)
from helmhive.cli.render import fail, printable
from helmhive.controller.kube.door import KubeError
from helmhive.policy.routing.route import RouteOutcome

__all__ = ["run"]

_EXIT = {RouteOutcome.ASSIGNED: 0, RouteOutcome.FAILED: 1, RouteOutcome.WAITING: 3}
_EXIT_UNREACHABLE = 4  # not 1: a script must tell "fails closed" from "could not ask"


def _timeout_seconds() -> float:
    try:
        return decide_timeout(os.environ.get(TIMEOUT_ENV))
    except ValueError as err:
        raise UsageError(str(err)) from None


def _subject(*, job: str | None, manifest: dict[str, Any] | None, namespace: str) -> str:
    """What a failed call was about, as the other cluster commands name it: ``agentjob NS/NAME``."""
    if manifest is None:
        return f"agentjob {namespace}/{job}"
    return f"agentjob {namespace}/{(manifest.get('metadata') or {}).get('name') or 'dry-run'} (dry run)"


def _explain(
    *, job: str | None, namespace: str | None, filename: Path | None, kubeconfig: Path | None
) -> Explanation | QueueStop:
    """Read what was asked, load the client, ask the cluster; every failure is one of the errors ``run`` maps."""
    manifest = read_manifest(filename) if filename is not None else None
    asked = manifest_namespace(manifest, namespace)
    seconds = _timeout_seconds()
    path = None if kubeconfig is None else str(kubeconfig)
    api_client = load_api_client(path)
    ns = asked or context_namespace(path)
    try:
        return ask(api_client=api_client, seconds=seconds, job_name=job, manifest=manifest, namespace=ns)
    except NoAnswer as err:
        raise NoAnswer(f"{_subject(job=job, manifest=manifest, namespace=ns)}: {err}") from None


def run(
    job: Annotated[str | None, typer.Argument(metavar="JOB", help="The AgentJob to explain.")] = None,
    namespace: Annotated[
        str | None, typer.Option("--namespace", "-n", metavar="NS", help="Namespace (default: the context's).")
    ] = None,
    filename: Annotated[
        Path | None,
        typer.Option("--filename", "-f", metavar="FILE", help="Dry-run this AgentJob manifest instead."),
    ] = None,
    output: Annotated[PrintFormat, typer.Option("--output", "-o", metavar="table|json")] = PrintFormat.TABLE,
    kubeconfig: Annotated[Path | None, typer.Option("--kubeconfig", metavar="PATH", help="Kubeconfig file.")] = None,
) -> None:
    """Explain the routing decision for a job (or a manifest, as a dry run): the choice and every candidate."""
    if (job is None) == (filename is None):
        raise fail("error: give a JOB name or -f FILE (one of them)", 2, colour=None)
    try:
        result = _explain(job=job, namespace=namespace, filename=filename, kubeconfig=kubeconfig)
    except UsageError as err:
        raise fail(f"error: {err}", 2, colour=None) from None
    except KubeconfigError as err:
        raise fail(f"cannot load kubeconfig: {err}", 2) from None  # as helmhive.cli.kubeapi.load_api
    except NoAnswer as err:
        raise fail(f"error: {err}", _EXIT_UNREACHABLE, colour=None) from None
    except KubeError as err:
        raise fail(f"error: the API server refused: {err.status} {err.message}", 2, colour=None) from None
    if isinstance(result, QueueStop):
        if output is PrintFormat.JSON:
            typer.echo(json.dumps(result.to_json(), indent=2))
        else:
            typer.echo(printable(result.line()), err=True)
        raise typer.Exit(result.exit_code)
    if output is PrintFormat.JSON:
        typer.echo(json.dumps(result.to_json(), indent=2))
    else:
        render_explanation(result, build_console())
    raise typer.Exit(_EXIT[result.decision.outcome])
