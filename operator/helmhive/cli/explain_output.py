"""What ``explain-routing`` prints: its two results, as one JSON object or as a table.

Owns :class:`Explanation` (the job was routed: the profile bound, the decision, every candidate,
the stored decision next to it) and :class:`QueueStop` (the job stops at queue time, before
routing: it waits for a Workspace or Profile, or fails closed), their JSON (one object of the same
shape for every outcome) and their text. Every value that comes from an object (names, messages,
reasons) is shown through :mod:`helmhive.cli.render`: as a rich ``Text``, never parsed as markup
or emoji, its control and invisible characters shown escaped.

Pure: it builds JSON and writes to the ``Console`` it is given. No API calls, no Kopf.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from helmhive.api.job import ProfileBinding
from helmhive.api.reasons import Reason
from helmhive.cli.render import safe_text
from helmhive.policy.conditions import find_condition
from helmhive.policy.routing.route import RouteOutcome, RoutingDecision, build_assignment
from helmhive.policy.routing.status import build_candidate_groups

__all__ = ["Explanation", "QueueStop", "build_console", "render_explanation"]

_COLOUR = {RouteOutcome.ASSIGNED: "green", RouteOutcome.WAITING: "yellow", RouteOutcome.FAILED: "red"}


@dataclass(frozen=True, kw_only=True)
class Explanation:
    """Everything ``explain-routing`` prints for a job that was routed (afresh, as a dry run)."""

    namespace: str
    name: str
    source: str
    binding: ProfileBinding
    decision: RoutingDecision
    memory_ids: list[str]
    stored: dict[str, Any]
    notes: list[str]

    def to_json(self) -> dict[str, Any]:
        decision = self.decision
        choice = decision.choice
        return {
            "job": {"namespace": self.namespace, "name": self.name, "source": self.source},
            "profile": {"name": self.binding.name, "revision": self.binding.revision},
            "decision": {
                "outcome": decision.outcome.value,
                "reason": decision.reason.value,
                "message": decision.message,
                "assignment": None
                if choice is None
                else {
                    **build_assignment(choice=choice, memory_ids=self.memory_ids, now=None),
                    "resumesSession": choice.resumes_session,
                },
                "consideredRunners": decision.considered_runners,
                "candidates": build_candidate_groups(decision.candidates),
                "retryAfterSeconds": decision.retry_after,
                "capacityDeadline": decision.capacity_deadline.isoformat() if decision.capacity_deadline else None,
                "avoidedProvider": decision.avoided_provider,
            },
            "stored": self.stored,
            "notes": self.notes,
        }


@dataclass(frozen=True, kw_only=True)
class QueueStop:
    """The job stops at queue time, before routing: it waits for a Workspace or Profile, or fails closed.

    ``deadline_reason`` is set while it waits: the reason it fails closed with at its deadline.
    """

    namespace: str
    name: str
    source: str
    reason: Reason
    message: str
    deadline_reason: Reason | None = None
    hint: str = ""
    stored: dict[str, Any]
    notes: list[str]

    @property
    def waiting(self) -> bool:
        return self.deadline_reason is not None

    @property
    def outcome(self) -> str:
        """``WaitingForWorkspace``/``WaitingForProfile`` while it waits, else ``Failed``."""
        return self.reason.value if self.waiting else RouteOutcome.FAILED.value

    @property
    def exit_code(self) -> int:
        return 3 if self.waiting else 2

    def line(self) -> str:
        if self.waiting:
            return f"the job waits at queue time: {self.reason.value}: {self.message}{self.hint}"
        return f"error: the job fails closed at queue time: {self.reason.value}: {self.message}"

    def to_json(self) -> dict[str, Any]:
        """The routed case's shape: no profile bound, no candidates; ``stage`` and ``deadlineReason`` added."""
        return {
            "job": {"namespace": self.namespace, "name": self.name, "source": self.source},
            "profile": None,
            "decision": {
                "stage": "queue",
                "outcome": self.outcome,
                "reason": self.reason.value,
                "message": self.message,
                "deadlineReason": self.deadline_reason.value if self.deadline_reason else None,
                "assignment": None,
                "consideredRunners": 0,
                "candidates": [],
                "retryAfterSeconds": None,
                "capacityDeadline": None,
                "avoidedProvider": None,
            },
            "stored": self.stored,
            "notes": self.notes,
        }


def build_console() -> Console:
    """Where the table goes: no emoji codes either (``:smile:`` in a name stays as written)."""
    return Console(width=160, emoji=False)


def render_explanation(explanation: Explanation, console: Console) -> None:
    """The explanation as text; every value from an object is shown as it is (escaped), never as markup."""
    decision = explanation.decision
    binding = explanation.binding
    console.print(
        safe_text(
            f"AgentJob {explanation.namespace}/{explanation.name} ({explanation.source}), profile "
            f"{binding.name} revision {binding.revision}"
        )
    )
    stored = explanation.stored
    if stored:
        routed = find_condition(stored.get("conditions"), "Routed")
        assignment = stored.get("assignment")
        if isinstance(assignment, dict) and assignment:
            console.print(
                safe_text(
                    f"Stored: assigned to {assignment.get('runnerNamespace', explanation.namespace)}/"
                    f"{assignment.get('runner')} with {assignment.get('provider')} {assignment.get('model')} "
                    f"({assignment.get('modelSource')}), memory {assignment.get('memoryIds') or []}"
                )
            )
        elif routed is not None:
            console.print(
                safe_text(f"Stored: Routed={routed.get('status')} {routed.get('reason')}: {routed.get('message')}")
            )
        console.print(safe_text("Now (dry run, this job not counted against its runner):"))
    headline = decision.outcome.value
    if decision.reason.value != headline:
        headline += f": {decision.reason.value}"
    console.print(safe_text(headline, style=f"bold {_COLOUR[decision.outcome]}"))
    console.print(safe_text(decision.message))
    choice = decision.choice
    if choice is not None:
        effort = choice.effort.value if choice.effort else "-"
        console.print(
            safe_text(
                f"runner {choice.runner_namespace}/{choice.runner} (pool {choice.pool}), provider {choice.provider}, "
                f"model {choice.model} ({choice.model_source.value}), effort {effort}, "
                f"mapping {choice.mapping_index}, credential generation {choice.credential_generation}, "
                f"memory {explanation.memory_ids}"
            )
        )
    if decision.retry_after is not None and decision.capacity_deadline is not None:
        console.print(
            safe_text(f"retry in {decision.retry_after:g}s; deadline {decision.capacity_deadline.isoformat()}")
        )
    table = Table(title=f"Candidates ({len(decision.candidates)} of {decision.considered_runners} runners)")
    for column in ("Runner", "Namespace", "Provider", "Mapping", "Model", "Reason"):
        table.add_column(column)
    for candidate in decision.candidates:
        table.add_row(
            safe_text(candidate.runner),
            safe_text(candidate.namespace),
            safe_text(candidate.provider),
            safe_text(candidate.mapping_index),
            safe_text(candidate.model),
            safe_text(candidate.reason),
        )
    console.print(table)
    for note in explanation.notes:
        console.print(safe_text(f"note: {note}", style="dim"))
