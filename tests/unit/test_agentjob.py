"""policy/agentjob: a job's state read once, one status patch per step, and the writer table."""

from __future__ import annotations

import copy
import datetime as dt
import re
from typing import Any

import pytest

from helmhive.api.job import Assignment, ModelSource
from helmhive.api.reasons import Reason
from helmhive.policy.agentjob import life as agentjob
from helmhive.policy.agentjob.life import (
    DERIVED_FIELDS,
    STATUS_WRITERS,
    STEP_WRITERS,
    AgentJob,
    StatusPatch,
    Step,
    Writer,
    apply_merge_patch,
    parse_agent_job,
    written_fields,
)
from helmhive.policy.agentjob.retry import MAX_AUTOMATIC_RETRIES
from helmhive.policy.routing.route import RouteChoice, RouteOutcome, RoutingDecision
from helmhive.policy.routing.step import route as route_step

NOW = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)
EARLIER = "2026-03-01T11:00:00Z"
BINDING = {"name": "p", "revision": "p-1", "hash": "h", "snapshot": {"filesystem": "read"}, "boundAt": EARLIER}


def cond(ctype: str, status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"type": ctype, "status": status, "reason": reason, "message": message, "lastTransitionTime": EARLIER}


def body(
    *,
    kind: str = "review-probe",
    conditions: list[dict[str, Any]] | None = None,
    cancel: bool = False,
    deleting: bool = False,
    **status: Any,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "j", "namespace": "team", "uid": "u-1", "generation": 1, "resourceVersion": "42"}
    if deleting:
        meta["deletionTimestamp"] = EARLIER
    if status or conditions:  # the operator has written it, so it observed generation 1
        status.setdefault("observedGeneration", 1)
    return {
        "apiVersion": "helmhive.dev/v1alpha1",
        "kind": "AgentJob",
        "metadata": meta,
        "spec": {"jobKind": kind, "workspace": "w", "request": {"title": "t", "prompt": "p"}, "cancel": cancel},
        "status": {**status, "conditions": conditions or []},
    }


ASSIGNMENT = {"runner": "r1", "pool": "pool", "provider": "anthropic", "model": "m", "assignedAt": EARLIER}

SAMPLES: dict[str, dict[str, Any]] = {
    "new": body(),
    "waiting-for-workspace": body(
        conditions=[cond("Routed", "False", "WaitingForWorkspace"), cond("Ready", "False", "WaitingForWorkspace")]
    ),
    "failed-closed-at-queue": body(conditions=[cond("Routed", "False", "WorkspaceNotFound")]),
    "bound": body(profile=BINDING),
    "waiting-for-capacity": body(
        profile=BINDING, routing={"attempts": 2}, conditions=[cond("Routed", "False", "WaitingForCapacity")]
    ),
    "failed-closed-at-routing": body(profile=BINDING, conditions=[cond("Routed", "False", "NoEligibleRunner")]),
    "assigned": body(profile=BINDING, assignment=ASSIGNMENT, conditions=[cond("Routed", "True", "Assigned")]),
    "running": body(
        profile=BINDING,
        assignment=ASSIGNMENT,
        result={"outcome": "Started", "startedAt": EARLIER},
        session={"mode": "fresh"},
        conditions=[
            cond("Routed", "True", "Assigned"),
            cond("Running", "True", "Started"),
            cond("Ready", "Unknown", "Started"),
        ],
    ),
    "finished": body(
        profile=BINDING,
        assignment=ASSIGNMENT,
        result={"outcome": "Completed", "startedAt": EARLIER, "completedAt": EARLIER},
        conditions=[cond("Running", "False", "Completed"), cond("Succeeded", "True", "Completed")],
    ),
    "cancelled": body(
        profile=BINDING,
        assignment=ASSIGNMENT,
        cancel=True,
        conditions=[cond("Succeeded", "False", "Cancelled")],
    ),
    "lost": body(profile=BINDING, assignment=ASSIGNMENT, conditions=[cond("Succeeded", "False", "RunnerLost")]),
    "requeued": body(profile=BINDING, attempts=1, conditions=[cond("Routed", "Unknown", "RunnerLost")]),
    "deleting": body(deleting=True),
}

STATES = (
    "bound",
    "waiting_for_reference",
    "waiting_for_capacity",
    "failed_closed",
    "assigned",
    "running",
    "started",
    "finished",
    "failed",
    "cancelled",
    "lost",
    "requeued",
    "needs_binding",
    "needs_routing",
)

EXPECTED_STATES: dict[str, set[str]] = {
    "new": {"needs_binding"},
    "waiting-for-workspace": {"waiting_for_reference", "needs_binding"},
    "failed-closed-at-queue": {"failed_closed"},
    "bound": {"bound", "needs_routing"},
    "waiting-for-capacity": {"bound", "waiting_for_capacity", "needs_routing"},
    "failed-closed-at-routing": {"bound", "failed_closed"},
    "assigned": {"bound", "assigned"},
    "running": {"bound", "assigned", "running", "started"},
    "finished": {"bound", "assigned", "started", "finished"},
    "cancelled": {"bound", "assigned", "finished", "failed", "cancelled"},
    "lost": {"bound", "assigned", "finished", "failed", "lost"},
    "requeued": {"bound", "requeued", "needs_routing"},
    "deleting": set(),
}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_the_state_of_each_sample_job(name: str) -> None:
    job = parse_agent_job(SAMPLES[name])
    assert {s for s in STATES if getattr(job, s)} == EXPECTED_STATES[name]


def test_the_held_runner_is_the_assignment_of_an_unfinished_job() -> None:
    assert parse_agent_job(SAMPLES["assigned"]).held_runner == ("team", "r1")
    assert parse_agent_job(SAMPLES["running"]).held_runner == ("team", "r1")
    assert parse_agent_job(SAMPLES["finished"]).held_runner is None
    elsewhere = body(profile=BINDING, assignment={**ASSIGNMENT, "runnerNamespace": "pools"})
    assert agentjob.decide_held_runner(elsewhere) == ("pools", "r1")


def test_parsing_never_raises_and_validates_the_typed_models_on_demand() -> None:
    job = parse_agent_job({"metadata": {"name": "x"}, "spec": "garbage", "status": ["garbage"]})
    assert (job.name, job.bound, job.finished, job.spec, job.binding) == ("x", False, False, None, None)
    typed = parse_agent_job(SAMPLES["finished"])
    assert typed.spec is not None and typed.spec.workspace == "w"
    assert typed.status is None, "the sample's binding snapshot is partial: the typed status does not validate"
    assert typed.status is None and typed.binding is None  # cached, still None


def test_a_condition_is_read_whole_and_with_status_reads_the_job_as_it_would_be() -> None:
    running = parse_agent_job(SAMPLES["running"])
    condition = running.condition("Running")
    assert condition is not None and condition["status"] == "True" and "lastTransitionTime" in condition
    assert running.condition("Succeeded") is None
    ended = running.with_status(SAMPLES["lost"]["status"])
    assert (ended.finished, ended.lost, ended.running, ended.held_runner) == (True, True, False, None)
    assert (ended.name, ended.uid, ended.resource_version) == (running.name, running.uid, running.resource_version)
    assert (running.finished, running.held_runner) == (False, ("team", "r1")), "the job read is unchanged"
    assert running.with_status({"conditions": "garbage"}).conditions == ()
    assert running.status_part("assignment")["runner"] == "r1"
    assert running.with_status({"result": "garbage"}).status_part("result") == {}


def test_refused_is_a_final_routed_false_whatever_the_assignment() -> None:
    refused = {n for n, b in SAMPLES.items() if parse_agent_job(b).refused}
    assert refused == {"failed-closed-at-queue", "failed-closed-at-routing"}
    odd = body(profile=BINDING, assignment=ASSIGNMENT, conditions=[cond("Routed", "False", "ProfileNotFound")])
    assert parse_agent_job(odd).refused and not parse_agent_job(odd).failed_closed


# One patch per step --------------------------------------------------------------------------------


def test_bind_writes_the_profile_and_sheds_the_waiting_conditions() -> None:
    waiting = parse_agent_job(
        body(conditions=[cond("Routed", "False", "WaitingForWorkspace"), cond("Ready", "False", "WaitingForWorkspace")])
    )
    patch = agentjob.bind(waiting, binding=BINDING, now=NOW)
    # Without its waiting Ready it is a job to route: kstatus's Reconciling says so, in the same write.
    assert set(patch.status) == {"profile", "conditions"} and patch.status["profile"] == BINDING
    (reconciling,) = patch.status["conditions"]
    assert (reconciling["type"], reconciling["status"], reconciling["reason"]) == ("Reconciling", "True", "Pending")
    new = agentjob.bind(parse_agent_job(SAMPLES["new"]), binding=BINDING, now=NOW).status
    assert new == {"profile": BINDING, "conditions": patch.status["conditions"], "observedGeneration": 1}
    # Bound again (a newer revision), nothing about its progress changes: only the binding is written.
    bound = parse_agent_job(body(conditions=patch.status["conditions"]))
    assert agentjob.bind(bound, binding=BINDING, now=NOW).status == {"profile": BINDING}


@pytest.mark.parametrize(
    ("step", "reason"),
    [(agentjob.wait, Reason.WAITING_FOR_WORKSPACE), (agentjob.fail, Reason.WORKSPACE_NOT_FOUND)],
)
def test_wait_and_fail_write_routed_and_ready_false_once(step: Any, reason: Reason) -> None:
    patch = step(parse_agent_job(SAMPLES["new"]), reason=reason, message="workspace w does not exist", now=NOW)
    kstatus = "Reconciling" if step is agentjob.wait else "Stalled"  # waiting moves on; failed closed does not
    assert {c["type"]: (c["status"], c["reason"]) for c in patch.status["conditions"]} == {
        "Routed": ("False", reason.value),
        "Ready": ("False", reason.value),
        kstatus: ("True", reason.value),
    }
    after = body(conditions=patch.status["conditions"])
    assert step(parse_agent_job(after), reason=reason, message="workspace w does not exist", now=NOW) is None


CHOICE = RouteChoice(
    runner_namespace="team",
    runner="r1",
    pool="pool",
    provider="anthropic",
    model="m",
    model_source=ModelSource.MAPPING,
    effort=None,
    mapping_index=0,
    credential_generation=3,
    resumes_session=False,
)


def decision(outcome: RouteOutcome) -> RoutingDecision:
    reason = {
        RouteOutcome.ASSIGNED: Reason.ASSIGNED,
        RouteOutcome.WAITING: Reason.WAITING_FOR_CAPACITY,
        RouteOutcome.FAILED: Reason.NO_ELIGIBLE_RUNNER,
    }[outcome]
    return RoutingDecision(
        outcome=outcome,
        reason=reason,
        message="m",
        choice=CHOICE if outcome is RouteOutcome.ASSIGNED else None,
        retry_after=4.0 if outcome is RouteOutcome.WAITING else None,
    )


def test_route_assigned_writes_assignment_routing_conditions_and_the_binding() -> None:
    patch = route_step(
        parse_agent_job(SAMPLES["new"]),
        decision=decision(RouteOutcome.ASSIGNED),
        memory_ids=["mem"],
        binding=BINDING,
        now=NOW,
    )
    assert set(patch.status) == {"profile", "routing", "conditions", "assignment", "observedGeneration"}
    assert patch.status["assignment"]["runner"] == "r1" and patch.status["assignment"]["memoryIds"] == ["mem"]
    typed = Assignment.model_validate(patch.status["assignment"])  # the wire form is the API's type
    assert typed.to_wire() == {**patch.status["assignment"], "assignedAt": typed.to_wire()["assignedAt"]}
    assert typed.assigned_at == NOW and typed.model_source is ModelSource.MAPPING
    conds = {c["type"]: (c["status"], c["reason"]) for c in patch.status["conditions"]}
    assert conds == {
        "Routed": ("True", "Assigned"),
        "Ready": ("Unknown", "Assigned"),
        "Reconciling": ("True", "Assigned"),
    }


def test_route_waiting_counts_one_more_attempt_and_failed_does_not() -> None:
    job = parse_agent_job(SAMPLES["waiting-for-capacity"])
    waiting = route_step(job, decision=decision(RouteOutcome.WAITING), now=NOW)
    assert waiting.status["routing"]["attempts"] == 3
    assert waiting.status["routing"]["nextAttemptAt"] == "2026-03-01T12:00:04Z"
    assert "assignment" not in waiting.status and "profile" not in waiting.status
    failed = route_step(job, decision=decision(RouteOutcome.FAILED), now=NOW)
    assert failed.status["routing"]["attempts"] == 2
    conds = {c["type"]: (c["status"], c["reason"]) for c in failed.status["conditions"]}
    assert conds == {
        "Routed": ("False", "NoEligibleRunner"),
        "Ready": ("False", "NoEligibleRunner"),
        "Stalled": ("True", "NoEligibleRunner"),
    }


def test_start_marks_running_and_resets_the_result_but_started_at() -> None:
    job = parse_agent_job(SAMPLES["assigned"])
    patch = agentjob.start(job, runner="r1", message="turn 1", session={"mode": "fresh"}, now=NOW)
    conds = {c["type"]: (c["status"], c["reason"]) for c in patch.status["conditions"]}
    assert conds["Running"] == ("True", "Started") and conds["Ready"] == ("Unknown", "Started")
    assert patch.status["result"]["startedAt"] == "2026-03-01T12:00:00Z"
    assert patch.status["result"]["completedAt"] is None and patch.status["result"]["memory"] is None
    assert patch.status["session"] == {"mode": "fresh"}
    assert patch.writer is Writer.RUNNER


@pytest.mark.parametrize("succeeded", [True, False])
def test_finish_ends_with_the_reason_and_keeps_started_at(succeeded: bool) -> None:
    job = parse_agent_job(SAMPLES["running"])
    reason = "Completed" if succeeded else "AgentFailed"
    patch = agentjob.finish(job, succeeded=succeeded, reason=reason, message="done", result={"summary": "s"}, now=NOW)
    conds = {c["type"]: (c["status"], c["reason"]) for c in patch.status["conditions"]}
    value = "True" if succeeded else "False"
    assert conds["Running"] == ("False", reason)
    assert conds["Succeeded"] == conds["Ready"] == (value, reason)
    assert patch.status["result"]["startedAt"] == EARLIER and patch.status["result"]["summary"] == "s"
    assert patch.status["result"]["outcome"] == reason
    assert parse_agent_job(body(conditions=patch.status["conditions"])).finished


def test_a_lost_job_that_may_have_written_ends_and_keeps_its_history() -> None:
    job = parse_agent_job(copy.deepcopy(SAMPLES["running"]) | {"spec": {"jobKind": "implementation-probe"}})
    outcome = agentjob.decide_lost(job, message="runner r1 went Offline", now=NOW)
    assert outcome.patch.step is Step.LOST and not outcome.requeued
    assert set(outcome.patch.status) == {"conditions", "result"}, "the assignment is not touched"
    after = parse_agent_job({**SAMPLES["running"], "status": apply_merge_patch(job.raw_status, outcome.patch.status)})
    assert after.lost and after.held_runner is None
    assert after.raw_status["result"]["startedAt"] == EARLIER


def test_a_lost_read_only_job_is_requeued_by_deleting_all_but_its_binding() -> None:
    job = parse_agent_job(SAMPLES["running"])
    outcome = agentjob.decide_lost(job, message="runner r1 went Offline", now=NOW)
    assert outcome.requeued and outcome.retry is not None and outcome.retry.retry
    status = outcome.patch.status
    assert status["assignment"] is None and status["result"] is None and status["attempts"] == 1
    assert "profile" not in status, "the binding is kept as it is"
    after = apply_merge_patch(job.raw_status, status)
    assert set(after) == {"profile", "attempts", "conditions", "observedGeneration"}, (
        "session, routing, result, assignment deleted"
    )
    assert [(c["type"], c["status"], c["reason"]) for c in after["conditions"]] == [
        ("Routed", "Unknown", "RunnerLost"),
        ("Reconciling", "True", "RunnerLost"),
    ]
    assert parse_agent_job({**SAMPLES["running"], "status": after}).requeued


def test_a_requeued_job_lost_again_ends() -> None:
    again = body(profile=BINDING, assignment=ASSIGNMENT, attempts=MAX_AUTOMATIC_RETRIES)
    outcome = agentjob.decide_lost(parse_agent_job(again), message="gone", now=NOW)
    assert outcome.patch.step is Step.LOST
    assert "not re-run: already re-run" in outcome.patch.status["conditions"][0]["message"]


def test_the_patch_is_made_conditional_on_the_resource_version_read() -> None:
    first = agentjob.bind(parse_agent_job(SAMPLES["new"]), binding=BINDING, now=NOW)
    patch = agentjob.bind(parse_agent_job(body(**first.status)), binding=BINDING, now=NOW)
    assert patch.conditional("42") == {"metadata": {"resourceVersion": "42"}, "status": {"profile": BINDING}}


def test_apply_merge_patch_follows_rfc_7386() -> None:
    assert apply_merge_patch({"a": 1, "b": {"c": 2, "d": 3}}, {"a": None, "b": {"c": None, "e": 4}, "f": [1]}) == {
        "b": {"d": 3, "e": 4},
        "f": [1],
    }


def test_the_replacement_is_the_status_the_merge_patch_would_make_conditional_on_the_version_read() -> None:
    waiting = SAMPLES["waiting-for-capacity"]
    before = copy.deepcopy(waiting)
    job = parse_agent_job(waiting)
    patch = route_step(job, decision=decision(RouteOutcome.ASSIGNED), binding=BINDING, now=NOW)
    put = patch.replacement(job)
    assert put["apiVersion"] == "helmhive.dev/v1alpha1" and put["kind"] == "AgentJob"
    # Only the name and the precondition: the API server keeps the rest of the stored object.
    assert put["metadata"] == {"name": "j", "namespace": "team", "resourceVersion": "42"}
    assert "spec" not in put
    assert put["status"] == apply_merge_patch(waiting["status"], patch.status)
    assert put["status"]["assignment"]["runner"] == "r1" and put["status"]["profile"] == BINDING
    assert waiting == before  # the job as read is not changed


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_every_steps_replacement_drops_what_its_patch_deletes(name: str) -> None:
    for job, patch in _every_step_on_every_sample():
        if job.raw_status is not SAMPLES[name]["status"]:
            continue
        status = patch.replacement(job)["status"]
        for key, value in patch.status.items():
            assert (
                (key not in status)
                if value is None
                else status[key] == apply_merge_patch(job.raw_status.get(key), value)
            ), (name, patch.step, key)
        assert {k: v for k, v in job.raw_status.items() if k not in patch.status} == {
            k: v for k, v in status.items() if k not in patch.status
        }, (name, patch.step)


# The writer table ------------------------------------------------------------------------------------


def _every_step_on_every_sample() -> list[tuple[AgentJob, StatusPatch]]:
    pairs: list[tuple[AgentJob, StatusPatch]] = []
    for sample in SAMPLES.values():
        job = parse_agent_job(sample)
        made: list[StatusPatch | None] = [
            agentjob.bind(job, binding=BINDING, now=NOW),
            agentjob.wait(job, reason=Reason.WAITING_FOR_WORKSPACE, message="m", now=NOW),
            agentjob.fail(job, reason=Reason.WORKSPACE_NOT_FOUND, message="m", now=NOW),
            *(route_step(job, decision=decision(o), binding=BINDING, now=NOW) for o in RouteOutcome),
            agentjob.start(job, runner="r1", message="m", session={"mode": "fresh"}, now=NOW),
            agentjob.finish(job, succeeded=False, reason="AgentFailed", message="m", result={}, now=NOW),
            agentjob.lost(job, message="m", why_not_rerun="w", now=NOW),
            agentjob.requeue(job, message="m", retry_message="r", now=NOW),
            agentjob.close(job, why_not_rerun="w", now=NOW),
        ]
        pairs += [(job, p) for p in made if p is not None]
    return pairs


def test_every_field_a_step_writes_is_in_the_table_with_that_steps_writer() -> None:
    seen: set[tuple[str, Writer, Step]] = set()
    for job, patch in _every_step_on_every_sample():
        for written in written_fields(job, patch) - DERIVED_FIELDS:
            assert written in STATUS_WRITERS, f"{patch.step} writes {written}, which the table does not list"
            writers = STATUS_WRITERS[written]
            assert patch.step in writers.get(patch.writer, frozenset()), (
                f"{patch.step} ({patch.writer}) writes {written}; the table says {dict(writers)}"
            )
            seen.add((written, patch.writer, patch.step))
    listed = {(f, w, s) for f, by in STATUS_WRITERS.items() for w, steps in by.items() for s in steps}
    assert listed - seen == set(), "the table lists writes no step makes"


def test_each_step_has_one_writer_and_the_docstring_table_is_the_data() -> None:
    assert set(STEP_WRITERS) == set(Step)
    doc = agentjob.__doc__ or ""
    rows = re.findall(r"^    (\S+)\s+(operator|runner)\s+(.+)$", doc, flags=re.MULTILINE)
    table: dict[str, dict[Writer, frozenset[Step]]] = {}
    for name, writer, steps in rows:
        table.setdefault(name, {})[Writer(writer)] = frozenset(Step(s.strip()) for s in steps.split(","))
    assert table == {k: dict(v) for k, v in STATUS_WRITERS.items()}
    for by in STATUS_WRITERS.values():
        for writer, steps in by.items():
            assert all(STEP_WRITERS[s] is writer for s in steps)
