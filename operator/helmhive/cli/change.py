"""``helmhive change status|patch|approve``: follow a governed change, take its patch, approve its plan.

* ``status`` shows each stage's job with the provider and model it ran on, the plan digest,
  the approval, the patch's size and digest, each check's result and the review's verdict.
* ``patch`` writes the stored patch to stdout, byte for byte, ready for ``git apply``; it
  refuses to print a patch whose SHA-256 differs from the one the Change records.
* ``approve`` sets ``spec.approvedPlan`` to the current plan's digest in the caller's name. The
  API server lets it through only for principals allowed the ``approve`` verb on
  ``changes.helmhive.dev`` and only in their own name (the ``helmhive-change-approval``
  ValidatingAdmissionPolicy); the operator audits who approved which digest.
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from helmhive.api.change import ChangeStatus
from helmhive.api.kubeerrors import KubeError
from helmhive.cli.kubeapi import CliKube, KubeconfigOption, NamespaceOption, api_error, load_api, whoami

app = typer.Typer(no_args_is_help=True, help="Follow a governed change, take its patch, approve its plan.")
PLURAL = "changes"
NameArgument = Annotated[str, typer.Argument(help="The Change's name.")]


def _get(api: CliKube, name: str, namespace: str) -> dict[str, Any]:
    try:
        return api.get(PLURAL, name, namespace)
    except KubeError as err:
        raise api_error(err, f"change {namespace}/{name}") from None


def _status(obj: dict[str, Any]) -> ChangeStatus:
    return ChangeStatus.model_validate(obj.get("status") or {})


@app.command()
def status(
    name: NameArgument,
    namespace: NamespaceOption = "default",
    kubeconfig: KubeconfigOption = None,
    output: Annotated[str, typer.Option("--output", "-o", help="table or json")] = "table",
) -> None:
    """Show each stage, its job, provider and model, the plan, the approval, the patch, the checks, the verdict."""
    obj = _get(load_api(kubeconfig), name, namespace)
    if output == "json":
        typer.echo(json.dumps(obj.get("status") or {}, indent=2, sort_keys=True))
        return
    st = _status(obj)
    console = Console(width=160)
    ready = next((c for c in st.conditions if c.type == "Ready"), None)
    headline = f"Ready={ready.status.value} {ready.reason}: {ready.message}" if ready else "not reconciled yet"
    console.print(f"[bold]Change {namespace}/{name}[/bold]  iteration {st.iteration}  {headline}")
    stages = Table(title="Stages", show_lines=False)
    for column in ("Stage", "Iteration", "Job", "Provider", "Model", "Outcome"):
        stages.add_column(column)
    for job in st.jobs:
        stages.add_row(
            job.stage.value, str(job.iteration), job.name, job.provider or "", job.model or "", job.outcome or "running"
        )
    console.print(stages)
    conditions = Table(title="Conditions")
    for column in ("Type", "Status", "Reason", "Message"):
        conditions.add_column(column)
    order = ["Planned", "Approved", "Implemented", "Checked", "Reviewed", "Ready"]
    for cond in sorted(st.conditions, key=lambda c: order.index(c.type) if c.type in order else len(order)):
        conditions.add_row(cond.type, cond.status.value, cond.reason, cond.message)
    console.print(conditions)
    if st.plan is not None:
        console.print(f"Plan {st.plan.digest} ({len(st.plan.steps)} steps): {st.plan.summary[:200]}")
    if st.approval is not None:
        console.print(f"Approved by {st.approval.by} at {st.approval.at:%Y-%m-%dT%H:%M:%SZ} ({st.approval.digest})")
    if st.patch is not None:
        p = st.patch
        console.print(f"Patch sha256 {p.sha256}: {p.bytes} bytes, {p.files} file(s), in ConfigMap {p.config_map}")
    if st.check_evidence:
        checks = Table(title="Checks")
        for column in ("Check", "Outcome", "Exit", "Seconds", "Output bytes", "Output sha256"):
            checks.add_column(column)
        for c in st.check_evidence:
            checks.add_row(
                c.name,
                c.outcome.value,
                "" if c.exit_code is None else str(c.exit_code),
                f"{c.duration_seconds:.1f}",
                str(c.output_bytes),
                (c.output_sha256 or "")[:16],
            )
        console.print(checks)
    if st.review is not None:
        r = st.review
        differs = {True: "a different provider", False: "the same provider, fresh context", None: "unknown"}
        console.print(
            f"Review (iteration {r.iteration}, job {r.job}): [bold]{r.verdict.value}[/bold] by {r.provider or '?'} "
            f"({differs[r.provider_differs]} than the implementation's {r.implementation_provider or '?'}); "
            f"{len(r.findings)} finding(s)"
        )
        for verdict in r.criteria:
            note = f" ({verdict.note})" if verdict.note else ""
            console.print(f"  criterion {verdict.criterion + 1}: {'met' if verdict.met else 'NOT met'}{note}")


@app.command()
def patch(name: NameArgument, namespace: NamespaceOption = "default", kubeconfig: KubeconfigOption = None) -> None:
    """Write the Change's latest patch to stdout, ready for ``git apply``, after checking its SHA-256."""
    api = load_api(kubeconfig)
    ref = _status(_get(api, name, namespace)).patch
    if ref is None:
        typer.secho(f"change {namespace}/{name} has no patch yet", fg=typer.colors.RED, err=True)
        raise typer.Exit(1)
    try:
        cm_data = api.config_map_data(ref.config_map, namespace)
    except KubeError as err:
        raise api_error(err, f"ConfigMap {namespace}/{ref.config_map}") from None
    text = cm_data.get(ref.key)
    if text is None:
        typer.secho(f"ConfigMap {ref.config_map} has no key {ref.key}", fg=typer.colors.RED, err=True)
        raise typer.Exit(1)
    data = text.encode()
    if hashlib.sha256(data).hexdigest() != ref.sha256:
        typer.secho(
            f"the stored patch's SHA-256 is not the {ref.sha256} the change records; not printed",
            fg=typer.colors.RED,
            err=True,
        )
        raise typer.Exit(1)
    sys.stdout.buffer.write(data)
    sys.stdout.flush()


@app.command()
def approve(
    name: NameArgument,
    namespace: NamespaceOption = "default",
    kubeconfig: KubeconfigOption = None,
    digest: Annotated[
        str | None, typer.Option(help="Approve only if the current plan has this digest (sha256:…).")
    ] = None,
) -> None:
    """Approve the Change's current plan, by its digest, in your own name."""
    api = load_api(kubeconfig)
    obj = _get(api, name, namespace)
    if (obj.get("spec") or {}).get("approval", "Automatic") != "Manual":
        typer.echo(f"change {namespace}/{name} approves its plan automatically; nothing to approve")
        return
    plan = _status(obj).plan
    if plan is None:
        typer.secho(f"change {namespace}/{name} has no plan yet; approve it once it is Planned", fg="red", err=True)
        raise typer.Exit(1)
    if digest is not None and digest != plan.digest:
        typer.secho(f"the plan is now {plan.digest}, not {digest}; review it again", fg=typer.colors.RED, err=True)
        raise typer.Exit(1)
    actor = whoami(api)
    body = {
        "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
        "spec": {"approvedPlan": {"digest": plan.digest, "by": actor.username}},
    }
    try:
        api.patch(PLURAL, name, namespace, body)
    except KubeError as err:
        raise api_error(err, f"approving change {namespace}/{name}") from None
    typer.echo(f"approved plan {plan.digest} of change {namespace}/{name} as {actor.username}")
