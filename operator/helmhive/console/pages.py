"""The console's reads and its one write, with the user's own credentials: each page's objects, then its model.

Owns the I/O behind each page: which objects a page reads, how a refused or failed read is told
on the page (the API server's own status and message), and the Approve action, which is
``change approve``'s own :func:`~helmhive.cli.change.approve_plan`. The job page's routing
decision is ``explain-routing``'s own :func:`~helmhive.cli.explain_cluster.ask`, and the patch
is ``change patch``'s own :func:`~helmhive.cli.change.read_patch`. Page models:
:mod:`helmhive.console.view`; HTML: :mod:`helmhive.console.html`.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import ValidationError

from helmhive.api.change import ChangeStatus
from helmhive.api.kubeerrors import Forbidden, KubeError, NotFound, Unavailable
from helmhive.cli.change import ChangeRefused, approve_plan, read_patch
from helmhive.cli.explain_cluster import NoAnswer, ask
from helmhive.cli.explain_output import QueueStop
from helmhive.cli.kubeapi import CliKube, describe_unavailable
from helmhive.console import audit_view, change_view, html, policy_html, profile_view, view
from helmhive.console.diff import render_diff

__all__ = ["Answer", "Pages", "describe_refusal"]

HIDDEN_SNAPSHOT_KEYS = frozenset({"instructions"})
"""Snapshot fields shown by their size only, as the audit records hide them."""


@dataclass(frozen=True)
class Answer:
    """A page: its HTTP status, its title, its ``<main>`` body and its model (for the JSON answer)."""

    status: int
    title: str
    main: str
    model: Any = None


def describe_refusal(err: KubeError, what: str) -> str:
    """One line for a failed call: the API server's status and message, or why there was no answer."""
    if isinstance(err, Unavailable):
        if err.status:
            return f"{what}: {describe_unavailable(err.status, err.message)}"
        return f"{what}: the API server cannot be reached: {err.message}; the page recovers once it answers"
    if isinstance(err, NotFound):
        return f"{what} does not exist (deleted, or not created yet): {err.message}"
    if isinstance(err, Forbidden):
        return f"{what}: the API server refused: {err.status} {err.message}"
    return f"{what}: the API server answered {err.status}: {err.message}"


def _status_of(err: KubeError) -> int:
    return {404: 404, 403: 403}.get(err.status, 502)


class Pages:
    """The pages of one console, reading with one user's client."""

    def __init__(self, api: CliKube, *, namespace: str) -> None:
        self.api = api
        self.namespace = namespace

    def _list(self, plural: str, *, everywhere: bool, problems: list[str]) -> list[dict[str, Any]]:
        if everywhere:
            try:
                return self.api.list_scoped(plural, None)[0]
            except Forbidden:
                problems.append(f"{plural}: shown for namespace {self.namespace} only (no permission to list all)")
        try:
            return self.api.list_scoped(plural, self.namespace)[0]
        except (Forbidden, NotFound) as err:
            problems.append(describe_refusal(err, f"listing {plural} in {self.namespace}"))
            return []

    def overview(self) -> Answer:
        problems: list[str] = []
        try:
            page = view.build_overview(
                namespace=self.namespace,
                pools=self._list("runnerpools", everywhere=True, problems=problems),
                runners=self._list("runners", everywhere=True, problems=problems),
                jobs=self._list("agentjobs", everywhere=False, problems=problems),
                changes=self._list("changes", everywhere=False, problems=problems),
                now=dt.datetime.now(dt.UTC),
                problems=problems,
            )
        except KubeError as err:
            return Answer(_status_of(err), "Overview", html.error_box(describe_refusal(err, "the overview")))
        return Answer(200, "Overview", html.render_overview(page), page)

    def memory(self) -> Answer:
        problems: list[str] = []
        records = self._list("memoryrecords", everywhere=False, problems=problems)
        records.sort(key=lambda r: str((r.get("metadata") or {}).get("name")))
        rows = [view.build_memory_row(r) for r in records]
        return Answer(200, "Memory records", html.render_memory(self.namespace, rows, problems), {"records": rows})

    def profiles(self) -> Answer:
        """Every profile beside its envelope (code and published), with its revisions (ControllerRevisions)."""
        problems: list[str] = []
        profiles = self._list("profiles", everywhere=False, problems=problems)
        envelopes, listed = [], True
        try:
            envelopes = self.api.list_scoped("envelopes", None)[0]
        except KubeError as err:
            listed = False
            problems.append(describe_refusal(err, "listing the published Envelopes"))
        revisions: list[dict[str, Any]] = []
        try:
            revisions = self.api.controller_revisions(self.namespace, profile_view.REVISION_LABEL)
        except KubeError as err:
            problems.append(
                describe_refusal(err, f"listing the profile revisions (ControllerRevisions) in {self.namespace}")
            )
        page = profile_view.build_profiles(
            namespace=self.namespace,
            profiles=profiles,
            revisions=revisions,
            envelopes=envelopes,
            envelopes_listed=listed,
            now=dt.datetime.now(dt.UTC),
            problems=problems,
        )
        return Answer(200, "Profiles", policy_html.render_profiles(page), page)

    def audit(self, params: dict[str, list[str]]) -> Answer:
        """The namespace's AuditRecords that match the search in ``params`` (the query string), newest first."""
        query, problems = audit_view.parse_audit_query(params)
        records = self._list("auditrecords", everywhere=False, problems=problems)
        page = audit_view.build_audit(namespace=self.namespace, records=records, query=query, problems=problems)
        return Answer(200, "Audit", policy_html.render_audit(page), page)

    def job(self, namespace: str, name: str) -> Answer:
        title = f"Job {namespace}/{name}"
        try:
            obj = self.api.get("agentjobs", name, namespace)
        except KubeError as err:
            return Answer(_status_of(err), title, html.error_box(describe_refusal(err, f"agentjob {namespace}/{name}")))
        note, explanation = "", None
        try:
            answer = ask(
                api_client=self.api.api_client,
                seconds=self.api.timeout,
                job_name=name,
                manifest=None,
                namespace=namespace,
            )
            if isinstance(answer, QueueStop):
                note = f"routing stops at queue time: {answer.line()}"
            else:
                explanation = answer.to_json()
        except NoAnswer as err:
            note = f"the routing decision could not be made: {err}"
        except KubeError as err:
            note = describe_refusal(err, "the routing decision")
        except Exception as err:  # explain-routing's usage errors (a malformed job): said, not a crash
            note = f"the routing decision could not be made: {err}"
        events: list[dict[str, Any]] = []
        try:
            events = self.api.events_about(namespace, "AgentJob", name)[0]
        except KubeError as err:
            note = (note + "; " if note else "") + describe_refusal(err, "its Events")
        page = view.build_job(
            job=obj,
            explanation=explanation,
            routing_note=note,
            events=events,
            snapshot_text=_snapshot_text((obj.get("status") or {}).get("profile") or {}),
        )
        return Answer(200, title, html.render_job(page), page)

    def change(self, namespace: str, name: str) -> Answer:
        title = f"Change {namespace}/{name}"
        try:
            obj = self.api.get("changes", name, namespace)
        except KubeError as err:
            return Answer(_status_of(err), title, html.error_box(describe_refusal(err, f"change {namespace}/{name}")))
        try:
            status = ChangeStatus.model_validate(obj.get("status") or {})
        except ValidationError as err:
            problem = f"change {namespace}/{name} has a status the console cannot read: {err.errors()[0]['msg']}"
            return Answer(502, title, html.error_box(problem))
        page = change_view.build_change(obj, status, self._stage_runners(namespace, {j.name for j in status.jobs}))
        patch_html, patch_note = "", ""
        if status.patch is not None:
            try:
                patch_html = render_diff(read_patch(self.api, name, namespace).decode("utf-8", errors="replace"))
            except ChangeRefused as err:
                patch_note = str(err)
            except KubeError as err:
                patch_note = describe_refusal(err, "the patch")
        return Answer(200, title, html.render_change(page, patch_html=patch_html, patch_note=patch_note), page)

    def _stage_runners(self, namespace: str, names: set[str]) -> dict[str, str]:
        """The runner each stage job was assigned to; none when the jobs cannot be listed (the stages still show)."""
        if not names:
            return {}
        try:
            jobs = self.api.list_scoped("agentjobs", namespace)[0]
        except KubeError:
            return {}
        found = {}
        for job in jobs:
            name = (job.get("metadata") or {}).get("name")
            runner = ((job.get("status") or {}).get("assignment") or {}).get("runner")
            if name in names and runner:
                found[str(name)] = str(runner)
        return found

    def patch_bytes(self, namespace: str, name: str) -> tuple[int, bytes]:
        """The raw patch, the same bytes as ``change patch``; or a status and one line why not."""
        try:
            return 200, read_patch(self.api, name, namespace)
        except ChangeRefused as err:
            return 409, str(err).encode()
        except KubeError as err:
            return _status_of(err), describe_refusal(err, f"change {namespace}/{name}").encode()

    def approve(self, namespace: str, name: str, digest: str) -> tuple[int, str]:
        """Approve exactly ``digest`` (``change approve --digest``); the status and the message to show."""
        try:
            approved, said = approve_plan(self.api, name, namespace, digest or None)
        except ChangeRefused as err:
            return 409, html.error_box(f"not approved: {err}")
        except KubeError as err:
            refusal = describe_refusal(err, f"approving change {namespace}/{name}")
            return _status_of(err), html.error_box(f"not approved: {refusal}")
        return 200, html.error_box(said, kind="ok" if approved else "info")


def _snapshot_text(profile: dict[str, Any]) -> str:
    snapshot = profile.get("snapshot")
    if not isinstance(snapshot, dict):
        return ""
    shown = {
        k: (f"({len(str(v))} characters, not shown)" if k in HIDDEN_SNAPSHOT_KEYS else v) for k, v in snapshot.items()
    }
    return yaml.safe_dump(shown, sort_keys=True)
