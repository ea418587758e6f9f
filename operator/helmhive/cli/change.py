"""``helmhive change status|patch|approve``: follow a governed change, take its patch, approve its plan.

* ``status`` shows each stage's job with the provider and model it ran on, the plan digest,
  the approval, the patch's size and digest, each check's result and the review's verdict.
* ``patch`` writes the stored patch to stdout, byte for byte, ready for ``git apply``; it
  refuses to print a patch whose SHA-256 differs from the one the Change records. On a
  terminal, control characters in it are shown escaped instead (:func:`decide_patch_output`).
* ``approve`` sets ``spec.approvedPlan`` to the current plan's digest in the caller's name. The
  API server lets it through only for principals allowed the ``approve`` verb on
  ``changes.helmhive.dev`` and only in their own name (the ``helmhive-change-approval``
  ValidatingAdmissionPolicy); the operator audits who approved which digest.

Everything read from the Change (plan summaries, messages and notes written by agents) is shown
through :func:`~helmhive.cli.render.printable` as plain text, never as rich markup. Without
``-n``, the namespace is the kubeconfig context's, as kubectl's is.
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table
from rich.text import Text

from helmhive.api.change import ChangeStatus
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
)
from helmhive.cli.render import fail, printable, safe_text

app = typer.Typer(no_args_is_help=True, help="Follow a governed change, take its patch, approve its plan.")
PLURAL = "changes"
NameArgument = Annotated[str, typer.Argument(help="The Change's name.")]


def _get(api: CliKube, name: str, namespace: str) -> dict[str, Any]:
    try:
        return api.get(PLURAL, name, namespace)
    except KubeError as err:
        raise api_error(err, f"change {namespace}/{name}") from None


def _status(obj: dict[str, Any], what: str) -> ChangeStatus:
    try:
        return _read_status(obj, what)
    except ChangeRefused as err:
        raise fail(str(err)) from None


def _line(text: object) -> Text:
    """Object text on a line of its own: control characters, newlines included, shown escaped; no markup."""
    return Text(printable("" if text is None else str(text), one_line=True))


def render_status(console: Console, *, namespace: str, name: str, st: ChangeStatus) -> None:
    """Print a Change's status for a reader; every string read from the object is shown, never interpreted."""
    ready = next((c for c in st.conditions if c.type == "Ready"), None)
    headline = f"Ready={ready.status.value} {ready.reason}: {ready.message}" if ready else "not reconciled yet"
    console.print(
        Text.assemble(
            (_line(f"Change {namespace}/{name}").plain, "bold"), f"  iteration {st.iteration}  ", _line(headline)
        )
    )
    stages = Table(title="Stages", show_lines=False)
    for column in ("Stage", "Iteration", "Job", "Provider", "Model", "Pod", "Outcome"):
        stages.add_column(column)
    for job in st.jobs:
        stages.add_row(
            *(
                safe_text(cell)
                for cell in (
                    job.stage.value,
                    job.iteration,
                    job.name,
                    job.provider,
                    job.model,
                    job.pod or "",
                    job.outcome or "running",
                )
            )
        )
    console.print(stages)
    conditions = Table(title="Conditions")
    for column in ("Type", "Status", "Reason", "Message"):
        conditions.add_column(column)
    order = ["Planned", "Approved", "Implemented", "Checked", "Reviewed", "Ready"]
    for cond in sorted(st.conditions, key=lambda c: order.index(c.type) if c.type in order else len(order)):
        conditions.add_row(*(safe_text(cell) for cell in (cond.type, cond.status.value, cond.reason, cond.message)))
    console.print(conditions)
    if st.plan is not None:
        plan = st.plan
        console.print(_line(f"Plan {plan.digest} ({len(plan.steps)} steps): {plan.summary[:200]}"))
    if st.approval is not None:
        a = st.approval
        console.print(_line(f"Approved by {a.by} at {a.at:%Y-%m-%dT%H:%M:%SZ} ({a.digest})"))
    if st.patch is not None:
        p = st.patch
        console.print(
            _line(f"Patch sha256 {p.sha256}: {p.bytes} bytes, {p.files} file(s), in ConfigMap {p.config_map}")
        )
    if st.check_evidence:
        checks = Table(title="Checks")
        for column in ("Check", "Outcome", "Exit", "Seconds", "Output bytes", "Output sha256"):
            checks.add_column(column)
        for c in st.check_evidence:
            checks.add_row(
                *(
                    safe_text(cell)
                    for cell in (
                        c.name,
                        c.outcome.value,
                        c.exit_code,
                        f"{c.duration_seconds:.1f}",
                        c.output_bytes,
                        (c.output_sha256 or "")[:16],
                    )
                )
            )
        console.print(checks)
    if st.review is not None:
        r = st.review
        differs = {True: "a different provider", False: "the same provider, fresh context", None: "unknown"}
        console.print(
            Text.assemble(
                _line(f"Review (iteration {r.iteration}, job {r.job}): "),
                (_line(r.verdict.value).plain, "bold"),
                _line(
                    f" by {r.provider or '?'} ({differs[r.provider_differs]} than the implementation's "
                    f"{r.implementation_provider or '?'}); {len(r.findings)} finding(s)"
                ),
            )
        )
        for verdict in r.criteria:
            note = f" ({verdict.note})" if verdict.note else ""
            console.print(_line(f"  criterion {verdict.criterion + 1}: {'met' if verdict.met else 'NOT met'}{note}"))


@app.command()
def status(
    name: NameArgument,
    namespace: NamespaceOption = None,
    kubeconfig: KubeconfigOption = None,
    output: OutputOption = PrintFormat.TABLE,
) -> None:
    """Show each stage, its job, provider and model, the plan, the approval, the patch, the checks, the verdict."""
    api = load_api(kubeconfig)
    ns = namespace or context_namespace(kubeconfig)
    obj = _get(api, name, ns)
    if output is PrintFormat.JSON:
        typer.echo(json.dumps(obj.get("status") or {}, indent=2, sort_keys=True))
        return
    render_status(Console(width=160), namespace=ns, name=name, st=_status(obj, f"change {ns}/{name}"))


def decide_patch_output(data: bytes, *, terminal: bool) -> tuple[bytes, bool]:
    """The bytes ``change patch`` writes, and whether they were escaped. Pure.

    Piped or redirected, the patch is written byte for byte (for ``git apply``). On a terminal, a
    patch holding control characters is shown with them escaped (see :func:`printable`), so an
    escape sequence in it cannot act on the reader's terminal.
    """
    if not terminal:
        return data, False
    text = data.decode("utf-8", errors="replace")
    shown = printable(text)
    return shown.encode("utf-8"), shown != text or text.encode() != data


class ChangeRefused(Exception):
    """A patch or an approval that cannot be had; the message (one line) says why."""


def read_patch(api: CliKube, name: str, namespace: str) -> bytes:
    """The Change's latest patch, byte for byte, once its SHA-256 is the one the Change records.

    The one reading of a patch, for ``change patch`` and the console alike. Raises
    :class:`ChangeRefused` or the API's :class:`~helmhive.api.kubeerrors.KubeError`.
    """
    ref = _read_status(api.get(PLURAL, name, namespace), f"change {namespace}/{name}").patch
    if ref is None:
        raise ChangeRefused(f"change {namespace}/{name} has no patch yet")
    text = api.config_map_data(ref.config_map, namespace).get(ref.key)
    if text is None:
        raise ChangeRefused(f"ConfigMap {ref.config_map} has no key {ref.key}")
    data = text.encode()
    if hashlib.sha256(data).hexdigest() != ref.sha256:
        raise ChangeRefused(f"the stored patch's SHA-256 is not the {ref.sha256} the change records; not printed")
    return data


def approve_plan(api: CliKube, name: str, namespace: str, digest: str | None) -> tuple[bool, str]:
    """Approve the Change's current plan in the caller's name; (approved, what happened, in one line).

    The one approval, for ``change approve`` and the console's Approve button alike: a merge patch of
    ``spec.approvedPlan`` conditional on the resourceVersion read, so the API server's RBAC and the
    ``helmhive-change-approval`` admission policy judge it. ``digest``, when given, must be the
    current plan's. Raises :class:`ChangeRefused` or the API's :class:`~helmhive.api.kubeerrors.KubeError`.
    """
    obj = api.get(PLURAL, name, namespace)
    if (obj.get("spec") or {}).get("approval", "Automatic") != "Manual":
        return False, f"change {namespace}/{name} approves its plan automatically; nothing to approve"
    plan = _read_status(obj, f"change {namespace}/{name}").plan
    if plan is None:
        raise ChangeRefused(f"change {namespace}/{name} has no plan yet; approve it once it is Planned")
    if digest is not None and digest != plan.digest:
        raise ChangeRefused(f"the plan is now {plan.digest}, not {digest}; review it again")
    actor = api.whoami()
    body = {
        "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
        "spec": {"approvedPlan": {"digest": plan.digest, "by": actor.username}},
    }
    api.patch(PLURAL, name, namespace, body)
    return True, f"approved plan {plan.digest} of change {namespace}/{name} as {actor.username}"


def _read_status(obj: dict[str, Any], what: str) -> ChangeStatus:
    try:
        return ChangeStatus.model_validate(obj.get("status") or {})
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(["status", *(str(part) for part in first["loc"])])
        raise ChangeRefused(f"{what} has a status this CLI cannot read: {where}: {first['msg']}") from None


@app.command()
def patch(name: NameArgument, namespace: NamespaceOption = None, kubeconfig: KubeconfigOption = None) -> None:
    """Write the Change's latest patch to stdout, ready for ``git apply``, after checking its SHA-256."""
    api = load_api(kubeconfig)
    ns = namespace or context_namespace(kubeconfig)
    try:
        data = read_patch(api, name, ns)
    except ChangeRefused as err:
        raise fail(str(err)) from None
    except KubeError as err:
        raise api_error(err, f"change {ns}/{name}") from None
    shown, escaped = decide_patch_output(data, terminal=sys.stdout.isatty())
    sys.stdout.buffer.write(shown)
    sys.stdout.flush()
    if escaped:
        typer.secho(
            "the patch holds control characters, shown escaped above; redirect or pipe it for the exact bytes",
            fg=typer.colors.YELLOW,
            err=True,
        )


@app.command()
def approve(
    name: NameArgument,
    namespace: NamespaceOption = None,
    kubeconfig: KubeconfigOption = None,
    digest: Annotated[
        str | None, typer.Option(help="Approve only if the current plan has this digest (sha256:…).")
    ] = None,
) -> None:
    """Approve the Change's current plan, by its digest, in your own name."""
    api = load_api(kubeconfig)
    ns = namespace or context_namespace(kubeconfig)
    try:
        _, said = approve_plan(api, name, ns, digest)
    except ChangeRefused as err:
        raise fail(str(err)) from None
    except KubeError as err:
        raise api_error(err, f"approving change {ns}/{name}") from None
    typer.echo(printable(said, one_line=True))
