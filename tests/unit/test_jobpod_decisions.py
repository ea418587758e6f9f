"""Decisions about job pods: the claim and its deadline, the warm set's plan, a pod's outcome for its job."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from pydantic import ValidationError

from helmhive.api.jobpod import AGENT_CONTAINER, LABEL_JOB, LABEL_POOL, LABEL_RUNNER, LABEL_WARM, SHIM_CONTAINER
from helmhive.api.kinds import API_VERSION
from helmhive.api.reasons import Reason
from helmhive.policy.jobpods.outcome import JobPodOutcome, decide_job_pod_outcome, decide_start_timeout
from helmhive.policy.jobpods.pod import DEADLINE_MARGIN_SECONDS, build_claim_patch, decide_claim_deadline
from helmhive.policy.jobpods.view import PodView
from helmhive.policy.jobpods.warmset import decide_warm_condition, decide_warm_pods

NOW = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)
POOL_OWNER = {"apiVersion": API_VERSION, "kind": "RunnerPool", "name": "claude", "uid": "p-uid", "controller": True}


def pod_dict(
    name: str = "claude-job-abcde",
    *,
    warm: bool = True,
    job: str | None = None,
    phase: str = "Running",
    started: dt.datetime | None = NOW - dt.timedelta(minutes=5),
    deleting: bool = False,
    reason: str = "",
    message: str = "",
    conditions: list[dict[str, Any]] | None = None,
    containers: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": "helmhive-job", LABEL_POOL: "claude"}
    if warm:
        labels[LABEL_WARM] = "true"
    if job:
        labels |= {LABEL_JOB: job, LABEL_RUNNER: "claude-0"}
    owner = (
        {"apiVersion": API_VERSION, "kind": "AgentJob", "name": job, "uid": "j-uid", "controller": True}
        if job
        else POOL_OWNER
    )
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "team-a",
        "uid": f"uid-{name}",
        "resourceVersion": "4711",
        "labels": labels,
        "ownerReferences": [owner],
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-03-01T11:59:00Z"
    status: dict[str, Any] = {"phase": phase, "reason": reason, "message": message, "conditions": conditions or []}
    if started is not None:
        status["startTime"] = started.strftime("%Y-%m-%dT%H:%M:%SZ")
    status["containerStatuses"] = [{"name": n, "state": s} for n, s in (containers or {}).items()]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "status": status}


def view(name: str = "claude-job-abcde", **kwargs: Any) -> PodView:
    return PodView.parse(pod_dict(name, **kwargs))


# --- the view ---------------------------------------------------------------------------------------


def test_the_view_reads_labels_owner_and_status() -> None:
    warm = view()
    assert (warm.name, warm.pool, warm.warm, warm.claimed, warm.job) == (
        "claude-job-abcde",
        "claude",
        True,
        False,
        None,
    )
    assert warm.status.start_time == NOW - dt.timedelta(minutes=5)
    claimed = view(job="review-42")  # still labelled warm: the job label and the owner win
    assert (claimed.warm, claimed.claimed, claimed.job, claimed.runner) == (False, True, "review-42", "claude-0")
    assert claimed.controller is not None and claimed.controller.kind == "AgentJob"
    assert view(deleting=True).deleting and view(phase="Failed").ended and not view(phase="Pending").ended


def test_the_view_clips_free_text_and_refuses_what_is_no_pod() -> None:
    long = view(message="m" * 10_000, reason="R" * 500)
    assert len(long.status.message) == 1024 and len(long.status.reason) == 128
    assert PodView.parse({}).name == ""  # a pod without metadata parses, and is nobody's
    with pytest.raises(ValidationError):
        PodView.parse({"metadata": {"name": "x" * 300}})
    with pytest.raises(ValidationError):
        PodView.parse({"status": {"startTime": "yesterday"}})


# --- the claim ---------------------------------------------------------------------------------------


def test_the_claim_patch_is_a_merge_patch_that_hands_the_pod_to_its_job() -> None:
    patch = build_claim_patch(
        pod=view(), job_name="review-42", job_uid="j-uid", runner="claude-1", timeout_seconds=1800, now=NOW
    )
    assert patch == {
        "metadata": {
            "labels": {LABEL_WARM: None, LABEL_JOB: "review-42", LABEL_RUNNER: "claude-1"},
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": "AgentJob",
                    "name": "review-42",
                    "uid": "j-uid",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "resourceVersion": "4711",
        },
        "spec": {"activeDeadlineSeconds": 300 + 1800 + DEADLINE_MARGIN_SECONDS},
    }


@pytest.mark.parametrize(
    ("started", "expected"),
    [
        (NOW - dt.timedelta(seconds=300), 300),
        (NOW - dt.timedelta(seconds=299, microseconds=1), 300),  # part of a second counts whole
        (NOW, 0),
        (NOW + dt.timedelta(seconds=30), 0),  # a start after now (clock skew) counts nothing
        (None, 0),  # not started yet: its deadline will run from a start no earlier than now
        (dt.datetime(2026, 3, 1, 11, 0, 0), 3600),  # naive: read as UTC
    ],
)
def test_the_claims_deadline_counts_from_the_pods_start(started: dt.datetime | None, expected: int) -> None:
    deadline = decide_claim_deadline(started=started, timeout_seconds=600, now=NOW)
    assert deadline == expected + 600 + DEADLINE_MARGIN_SECONDS


def test_the_clock_is_the_callers() -> None:
    pod = view(started=NOW)
    later = [
        build_claim_patch(
            pod=pod, job_name="j", job_uid="u", runner="r", timeout_seconds=60, now=NOW + dt.timedelta(seconds=s)
        )["spec"]["activeDeadlineSeconds"]
        for s in (0, 1, 3600)
    ]
    assert later == [180, 181, 3780]


def test_only_a_warm_pod_can_be_claimed() -> None:
    for pod in (view(job="other"), view(warm=False)):
        with pytest.raises(ValueError, match="not a warm job pod"):
            build_claim_patch(pod=pod, job_name="j", job_uid="u", runner="r", timeout_seconds=60, now=NOW)
    with pytest.raises(ValueError):
        build_claim_patch(pod=view(), job_name="j", job_uid="u", runner="r", timeout_seconds=0, now=NOW)


# --- the warm set --------------------------------------------------------------------------------------


def test_the_warm_set_is_filled_up() -> None:
    plan = decide_warm_pods(want=3, pods=[view("w1"), view("c1", warm=False, job="j1")])
    assert (plan.create, plan.delete) == (2, ())


def test_failed_warm_pods_are_deleted_and_replaced() -> None:
    pods = [view("w1"), view("dead", phase="Failed"), view("done", phase="Succeeded")]
    plan = decide_warm_pods(want=2, pods=pods)
    assert plan.create == 1
    assert [p.name for p in plan.delete] == ["dead", "done"]


def test_surplus_warm_pods_go_the_least_ready_first() -> None:
    pods = [
        view("old", started=NOW - dt.timedelta(hours=2)),
        view("new", started=NOW - dt.timedelta(minutes=1)),
        view("pending", phase="Pending", started=None),
        view("mid", started=NOW - dt.timedelta(hours=1)),
    ]
    plan = decide_warm_pods(want=2, pods=pods)
    assert plan.create == 0
    assert [p.name for p in plan.delete] == ["new", "pending"]
    assert [p.name for p in decide_warm_pods(want=0, pods=pods).delete] == ["old", "mid", "new", "pending"]


def test_a_claimed_pod_is_never_deleted_nor_counted() -> None:
    claimed = [view(f"c{i}", job=f"j{i}") for i in range(3)]
    claimed += [view("failed-claimed", job="jf", phase="Failed"), view("unlabelled", warm=False)]
    plan = decide_warm_pods(want=0, pods=claimed)
    assert (plan.create, plan.delete) == (0, ())
    assert decide_warm_pods(want=2, pods=claimed).create == 2


def test_a_pod_being_deleted_is_neither_counted_nor_deleted_again() -> None:
    plan = decide_warm_pods(
        want=1, pods=[view("going", deleting=True), view("going-failed", deleting=True, phase="Failed")]
    )
    assert (plan.create, plan.delete) == (1, ())


def test_a_warm_pod_that_cannot_start_is_kept() -> None:
    stuck = view("stuck", phase="Pending", containers={AGENT_CONTAINER: {"waiting": {"reason": "ImagePullBackOff"}}})
    assert decide_warm_pods(want=1, pods=[stuck]).delete == ()
    with pytest.raises(ValueError):
        decide_warm_pods(want=-1, pods=[])


READY = [{"type": "Ready", "status": "True"}]


def test_the_warm_condition_counts_ready_warm_pods_only() -> None:
    pods = [
        view("a", conditions=READY),
        view("b", phase="Pending", started=None),
        view("claimed", job="j1", conditions=READY),
        view("going", deleting=True, conditions=READY),
    ]
    starting = decide_warm_condition(want=2, pods=pods)
    assert (starting.status, starting.reason, starting.ready) == (False, Reason.WARM_PODS_STARTING, 1)
    assert starting.message == "1 of 2 warm pods ready"
    ready = decide_warm_condition(want=1, pods=pods)
    assert (ready.status, ready.reason, ready.ready) == (True, Reason.WARM_PODS_READY, 1)
    none = decide_warm_condition(want=0, pods=[])
    assert (none.status, none.reason) == (True, Reason.NO_WARM_PODS)


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"containers": {AGENT_CONTAINER: {"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}}}},
         "container agent ImagePullBackOff: no such image"),
        ({"containers": {AGENT_CONTAINER: {"waiting": {"reason": "ErrImagePull"}}}}, "container agent ErrImagePull"),
        ({"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                          "message": "0/2 nodes are available"}]}, "Unschedulable: 0/2 nodes are available"),
        ({"containers": {AGENT_CONTAINER: {"terminated": {"reason": "StartError", "exitCode": 128}}}},
         "container agent StartError"),
    ],
    ids=["pull-backoff", "pull-error", "unschedulable", "start-error"],
)  # fmt: skip
def test_a_warm_pod_that_cannot_become_ready_is_named_with_its_reason(kwargs: dict[str, Any], said: str) -> None:
    pods = [view("zz-ok", conditions=READY), view("aa-stuck", phase="Pending", started=None, **kwargs)]
    verdict = decide_warm_condition(want=2, pods=pods)
    assert (verdict.status, verdict.reason, verdict.ready) == (False, Reason.WARM_POD_FAILING, 1)
    assert verdict.message == f"warm pod aa-stuck cannot become ready (1 of 2 ready): {said}"
    # Enough ready pods beside it: the set is ready (the stuck one is the kubelet's to retry).
    assert decide_warm_condition(want=1, pods=pods).reason is Reason.WARM_PODS_READY


def test_refused_warm_pod_writes_come_first() -> None:
    verdict = decide_warm_condition(want=1, pods=[view("a", conditions=READY)], keep_error="exceeded quota: pods=4")
    assert (verdict.status, verdict.reason) == (False, Reason.WARM_PODS_NOT_KEPT)
    assert verdict.message == "warm job pods not kept (1 of 1 ready): exceeded quota: pods=4"


# --- a pod's outcome for its job ----------------------------------------------------------------------

OOM = {"terminated": {"reason": "OOMKilled", "exitCode": 137}}


@pytest.mark.parametrize(
    ("pod", "reason", "base", "words"),
    [
        pytest.param(
            dict(containers={AGENT_CONTAINER: OOM, SHIM_CONTAINER: {"running": {}}}),
            "ResourceLimitExceeded:memory",
            Reason.RESOURCE_LIMIT_EXCEEDED,
            "memory limit",
            id="agent-oom",
        ),
        pytest.param(
            dict(phase="Failed", reason="DeadlineExceeded", message="Pod was active on the node longer than specified"),
            "TimedOut",
            Reason.TIMED_OUT,
            "deadline",
            id="deadline",
        ),
        pytest.param(
            dict(phase="Failed", reason="Evicted", message="The node was low on resource: memory."),
            "JobPodLost:Evicted",
            Reason.JOB_POD_LOST,
            "low on resource",
            id="evicted",
        ),
        pytest.param(
            dict(phase="Failed", reason="Preempting"),
            "JobPodLost:Preempting",
            Reason.JOB_POD_LOST,
            "Preempting",
            id="preempted-by-kubelet",
        ),
        pytest.param(
            dict(conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]),
            "JobPodLost:PreemptionByScheduler",
            Reason.JOB_POD_LOST,
            "taken away",
            id="preempted-by-scheduler",
        ),
        pytest.param(
            dict(conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}]),
            "JobPodLost:EvictionByEvictionAPI",
            Reason.JOB_POD_LOST,
            "EvictionByEvictionAPI",
            id="drained",
        ),
        pytest.param(
            dict(phase="Failed", reason="OutOfcpu", message="Node didn't have enough resource: cpu"),
            "JobPodLost:OutOfcpu",
            Reason.JOB_POD_LOST,
            "enough resource",
            id="rejected-by-its-node",
        ),
        pytest.param(
            dict(
                phase="Pending",
                containers={
                    AGENT_CONTAINER: {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}
                },
            ),
            "JobPodFailed:ImagePullBackOff",
            Reason.JOB_POD_FAILED,
            "container agent",
            id="image-pull-back-off",
        ),
        pytest.param(
            dict(
                phase="Pending",
                containers={
                    SHIM_CONTAINER: {
                        "waiting": {
                            "reason": "CreateContainerConfigError",
                            "message": 'secret "claude-jobpod-link" not found',
                        }
                    }
                },
            ),
            "JobPodFailed:CreateContainerConfigError",
            Reason.JOB_POD_FAILED,
            "claude-jobpod-link",
            id="missing-link-key",
        ),
        pytest.param(
            dict(containers={AGENT_CONTAINER: {"terminated": {"reason": "StartError", "exitCode": 128}}}),
            "JobPodFailed:StartError",
            Reason.JOB_POD_FAILED,
            "cannot start",
            id="start-error",
        ),
    ],
)
def test_a_pods_state_decides_its_running_jobs_failure(
    pod: dict[str, Any], reason: str, base: Reason, words: str
) -> None:
    outcome = decide_job_pod_outcome(pod=view(warm=False, job="review-42", **pod), job_finished=False)
    assert outcome is not None
    assert (outcome.reason, outcome.base) == (reason, base)
    assert words in outcome.message and len(outcome.message) <= 1024


def test_the_pod_gone_while_the_job_runs_is_lost() -> None:
    assert decide_job_pod_outcome(pod=None, job_finished=False) == JobPodOutcome(
        reason="JobPodLost", base=Reason.JOB_POD_LOST, message="the job's pod was deleted while the job was running"
    )


@pytest.mark.parametrize(
    "pod",
    [
        pytest.param(dict(), id="running"),
        pytest.param(
            dict(
                phase="Pending",
                started=None,
                conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
            ),
            id="unschedulable",
        ),
        pytest.param(
            dict(phase="Pending", containers={AGENT_CONTAINER: {"waiting": {"reason": "ErrImagePull"}}}),
            id="first-pull-failure",
        ),
        pytest.param(
            dict(phase="Pending", containers={AGENT_CONTAINER: {"waiting": {"reason": "ContainerCreating"}}}),
            id="creating",
        ),
        pytest.param(
            dict(containers={AGENT_CONTAINER: {"terminated": {"reason": "Error", "exitCode": 1}}}), id="agent-exited"
        ),
        pytest.param(
            dict(phase="Failed", containers={SHIM_CONTAINER: {"terminated": {"reason": "Error", "exitCode": 2}}}),
            id="shim-exited",
        ),
        pytest.param(dict(phase="Succeeded"), id="succeeded"),
        pytest.param(dict(conditions=[{"type": "DisruptionTarget", "status": "False"}]), id="disruption-cleared"),
        pytest.param(dict(containers={SHIM_CONTAINER: OOM}), id="shim-oom-is-the-runners-to-report"),
    ],
)
def test_what_the_runner_reports_or_the_caller_times_is_not_decided_here(pod: dict[str, Any]) -> None:
    assert decide_job_pod_outcome(pod=view(warm=False, job="review-42", **pod), job_finished=False) is None


@pytest.mark.parametrize("pod", [None, dict(containers={AGENT_CONTAINER: OOM}), dict(phase="Failed", reason="Evicted")])
def test_a_finished_jobs_outcome_stands(pod: dict[str, Any] | None) -> None:
    seen = None if pod is None else view(warm=False, job="review-42", **pod)
    assert decide_job_pod_outcome(pod=seen, job_finished=True) is None


def test_oom_wins_over_the_pods_own_reason() -> None:
    both = view(warm=False, job="j", phase="Failed", reason="Evicted", containers={AGENT_CONTAINER: OOM})
    outcome = decide_job_pod_outcome(pod=both, job_finished=False)
    assert outcome is not None and outcome.reason == "ResourceLimitExceeded:memory"


def test_a_pod_being_deleted_under_its_job_is_lost_unless_something_else_says_more() -> None:
    deleted = decide_job_pod_outcome(pod=view(warm=False, job="j", deleting=True), job_finished=False)
    assert deleted is not None and (deleted.reason, deleted.base) == ("JobPodLost:Deleted", Reason.JOB_POD_LOST)
    evicted = view(
        warm=False, job="j", deleting=True,
        conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}],
    )  # fmt: skip
    named = decide_job_pod_outcome(pod=evicted, job_finished=False)
    assert named is not None and named.reason == "JobPodLost:EvictionByEvictionAPI"
    oom = view(warm=False, job="j", deleting=True, containers={AGENT_CONTAINER: OOM})
    assert decide_job_pod_outcome(pod=oom, job_finished=False).reason == "ResourceLimitExceeded:memory"  # type: ignore[union-attr]


# --- a pod that has not started in time -------------------------------------------------------------------

UNSCHEDULABLE = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector.",
}


@pytest.mark.parametrize(
    ("pod", "reason", "said"),
    [
        pytest.param(
            dict(phase="Pending", conditions=[UNSCHEDULABLE]),
            "JobPodFailed:Unschedulable",
            "pod p was not scheduled within 45 s (execution.startTimeoutSeconds): 0/2 nodes are available: 2 node(s)"
            " didn't match Pod's node affinity/selector.",
            id="unschedulable",
        ),
        pytest.param(
            dict(phase="Pending", conditions=[{"type": "PodScheduled", "status": "False", "reason": "SchedulerError"}]),
            "JobPodFailed:SchedulerError",
            "pod p was not scheduled within 45 s (execution.startTimeoutSeconds)",
            id="scheduler-error",
        ),
        pytest.param(
            dict(
                phase="Pending",
                conditions=[{"type": "PodScheduled", "status": "True"}],
                containers={
                    SHIM_CONTAINER: {"waiting": {"reason": "ContainerCreating"}},
                    AGENT_CONTAINER: {"waiting": {"reason": "ErrImagePull"}},
                },
            ),
            "JobPodFailed:StartTimeout",
            "pod p did not start within 45 s (execution.startTimeoutSeconds): container shim ContainerCreating, "
            "container agent ErrImagePull",
            id="pulling",
        ),
        pytest.param(
            dict(phase="Pending", started=None),
            "JobPodFailed:StartTimeout",
            "pod p did not start within 45 s (execution.startTimeoutSeconds): phase Pending",
            id="nothing-said",
        ),
    ],
)
def test_a_pod_not_started_in_time_is_named_with_what_it_waits_for(pod: dict[str, Any], reason: str, said: str) -> None:
    outcome = decide_start_timeout(pod=view("p", warm=False, job="j", **pod), seconds=45)
    assert (outcome.reason, outcome.base, outcome.message) == (reason, Reason.JOB_POD_FAILED, said)
