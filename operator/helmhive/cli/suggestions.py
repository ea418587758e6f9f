"""``helmhive suggestions list|export JOB``: a policy-suggestion job's suggestions, as MemoryRecord files.

* ``list`` shows each suggestion of the job: the record it would become (name, kind, scope,
  sensitivity), its digest, the start of its text, and why it cannot be a record if it cannot.
* ``export`` writes each valid suggestion as a ready MemoryRecord YAML file (``<record>.yaml`` in
  ``--output-dir``), its source the job, for a human to commit through a pull request. Before it
  writes any file it creates a SuggestionExport in the caller's name (the
  ``helmhive-suggestion-export`` admission policy refuses any other name), which the operator
  records as a ``SuggestionsExported`` AuditRecord. If that is refused, nothing is written.

Neither command applies anything: no MemoryRecord or Profile is created or changed in the cluster.
Every record is checked as ``helmhive validate`` checks files, with the job's Workspace when the
caller may read it. What the agent wrote is shown through :func:`~helmhive.cli.render.printable`.
Without ``-n``, the namespace is the kubeconfig context's, as kubectl's is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from helmhive.api.kubeerrors import KubeError
from helmhive.cli.kubeapi import (
    CliKube,
    KubeconfigOption,
    NamespaceOption,
    OutputOption,
    PrintFormat,
    api_error,
    context_namespace,
    load_api,
    whoami,
)
from helmhive.cli.render import fail, printable, safe_text
from helmhive.policy.suggestions.export import (
    JobSuggestions,
    SuggestionError,
    SuggestionView,
    build_record_file,
    build_stored_output,
    build_suggestion_export,
    decide_job_suggestions,
    decide_stored_output,
)

app = typer.Typer(no_args_is_help=True, help="List a policy-suggestion job's suggestions; export them as files.")
JobArgument = Annotated[str, typer.Argument(help="The policy-suggestion AgentJob's name.")]
_TEXT_SHOWN = 60


def _read(api: CliKube, job_name: str, namespace: str) -> tuple[JobSuggestions, str]:
    """The job's suggestions, and a note if its Workspace could not be read (services then unchecked)."""
    try:
        job = api.get("agentjobs", job_name, namespace)
    except KubeError as err:
        raise api_error(err, f"agentjob {namespace}/{job_name}") from None
    workspace_name = str((job.get("spec") or {}).get("workspace") or "")
    workspace: dict[str, Any] | None = None
    note = ""
    try:
        workspace = api.get("workspaces", workspace_name, namespace)
    except KubeError as err:
        note = (
            f"workspace {namespace}/{workspace_name} not read ({err.status or 'no answer'}): service scopes not checked"
        )
    try:
        stored_output = None
        stored = decide_stored_output(job)
        if stored is not None:  # over 16 KiB: the runner kept the output in the job's artifacts ConfigMap
            try:
                data = api.config_map_data(stored.config_map, namespace)
            except KubeError as err:
                raise api_error(err, f"ConfigMap {namespace}/{stored.config_map}") from None
            stored_output = build_stored_output(stored, data.get(stored.key), where=f"agentjob {namespace}/{job_name}")
        return decide_job_suggestions(job=job, workspace=workspace, stored_output=stored_output), note
    except SuggestionError as err:
        raise fail(f"{err.reason.value}: {err.message}") from None


def _problems(view: SuggestionView) -> list[str]:
    return [f"{p.field_path}: {p.reason.value}: {p.message}" for p in view.problems]


def _row(view: SuggestionView) -> dict[str, Any]:
    s = view.suggestion
    return {
        "index": view.index,
        "record": view.record_name,
        "digest": view.digest,
        "kind": s.kind.value if s else None,
        "scope": (s.scope.service or s.scope.type.value) if s else None,
        "sensitivity": s.sensitivity.value if s else None,
        "text": s.text if s else None,
        "valid": view.valid,
        "problems": _problems(view),
    }


@app.command("list")
def list_suggestions(
    job: JobArgument,
    namespace: NamespaceOption = None,
    kubeconfig: KubeconfigOption = None,
    output: OutputOption = PrintFormat.TABLE,
) -> None:
    """List the job's suggestions: the record each would become, its digest, and any problem."""
    api = load_api(kubeconfig)
    ns = namespace or context_namespace(kubeconfig)
    found, note = _read(api, job, ns)
    rows = [_row(v) for v in found.views]
    if output is PrintFormat.JSON:
        typer.echo(json.dumps(rows, indent=2))
    else:
        table = Table(title=Text(printable(f"suggestions of agentjob {ns}/{job}", one_line=True)))
        for column in ("#", "Record", "Kind", "Scope", "Sensitivity", "Digest", "Text", "Problems"):
            table.add_column(column)
        for row in rows:
            text = row["text"] or ""
            shown = text if len(text) <= _TEXT_SHOWN else text[: _TEXT_SHOWN - 1] + "…"
            table.add_row(
                *(
                    safe_text(cell)
                    for cell in (
                        row["index"] + 1,
                        row["record"],
                        row["kind"],
                        row["scope"],
                        row["sensitivity"],
                        row["digest"][:19],
                        printable(shown, one_line=True),
                        "; ".join(row["problems"]) or "-",
                    )
                )
            )
        Console(width=200).print(table)
    if note:
        typer.secho(printable(note, one_line=True), fg=typer.colors.YELLOW, err=True)


def _plan(directory: Path, files: dict[str, str], *, overwrite: bool) -> None:
    """Refuse, before anything is recorded or written, a file that exists with other content."""
    for name, text in files.items():
        path = directory / name
        if path.is_dir():
            raise fail(f"{path} is a directory")
        if path.exists() and not overwrite and path.read_text(encoding="utf-8", errors="replace") != text:
            raise fail(f"{path} exists with other content; remove it, choose another --output-dir, or pass --overwrite")


@app.command()
def export(
    job: JobArgument,
    namespace: NamespaceOption = None,
    kubeconfig: KubeconfigOption = None,
    output_dir: Annotated[
        Path, typer.Option("--output-dir", "-o", help="Where to write the files (created if missing).")
    ] = Path("."),
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace files that exist with other content.")
    ] = False,
) -> None:
    """Write each valid suggestion as a MemoryRecord file for a pull request; the export is audited. Applies nothing."""
    api = load_api(kubeconfig)
    ns = namespace or context_namespace(kubeconfig)
    found, note = _read(api, job, ns)
    if note:
        typer.secho(printable(note, one_line=True), fg=typer.colors.YELLOW, err=True)
    for view in found.views:
        for problem in _problems(view):
            typer.secho(
                printable(f"suggestion {view.index + 1} ({view.digest[:19]}) not exported: {problem}", one_line=True),
                fg=typer.colors.RED,
                err=True,
            )
    valid = found.valid
    if not valid:
        raise fail(f"no suggestion of agentjob {ns}/{job} makes a valid MemoryRecord; nothing exported")
    actor = whoami(api)
    files = {
        f"{v.record_name}.yaml": build_record_file(
            job=found.job, view=v, total=len(found.views), exported_by=actor.username
        )
        for v in valid
    }
    _plan(output_dir, files, overwrite=overwrite)
    request = build_suggestion_export(job=found.job, views=valid, exported_by=actor.username)
    try:
        created = api.create("suggestionexports", ns, request)
    except KubeError as err:
        raise api_error(err, "recording the export (nothing was written)") from None
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (output_dir / name).write_text(text, encoding="utf-8")
    except OSError as err:
        raise fail(f"writing {output_dir}: {err.strerror or err}") from None
    for name in files:
        typer.echo(printable(str(output_dir / name), one_line=True))
    typer.echo(
        printable(
            f"exported {len(files)} of {len(found.views)} suggestion(s) of agentjob {ns}/{job} as {actor.username}; "
            f"the operator records it (SuggestionExport {created['metadata']['name']}). Nothing was applied: "
            "commit the files through a pull request",
            one_line=True,
        ),
        err=True,
    )
    if len(valid) < len(found.views):
        raise typer.Exit(1)
