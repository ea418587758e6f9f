"""A job's pod on a real API server (no kubelet): claimed from the warm set or created, waited for, judged, deleted.

The runner's calls (:class:`~helmhive.runner.kube.RunnerKube`'s pod calls, through
:mod:`helmhive.runner.jobs.podclaim`) run as a ServiceAccount with exactly the rights a JobPod
pool's Role gives about pods (get, list, watch, create, patch, delete, and ``agentjobs/finalizers``
update for the AgentJob ownerReference with ``blockOwnerDeletion``). The pool, its jobs and its warm
pod are real objects, created with the admin client as the operator would. Pods never run here:
where one must, the test writes what the kubelet would (its status: Running, an address, the shim
started) with the admin client.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import json
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kubernetes import client

from harness.identity import Identity
from harness.kube import IdentityFactory, Kube
from harness.wait import wait_for
from helmhive.api.jobpod import AGENT_CONTAINER, LABEL_JOB, LABEL_RUNNER, LABEL_WARM, SHIM_CONTAINER
from helmhive.api.kinds import GROUP, VERSION
from helmhive.api.runnerpool import RunnerPoolSpec
from helmhive.policy.jobpods.identity import JobRef
from helmhive.policy.jobpods.outcome import JobPodOutcome
from helmhive.policy.jobpods.pod import DEADLINE_MARGIN_SECONDS, build_claim_patch, build_cold_job_pod, build_job_pod
from helmhive.policy.jobpods.view import PodView
from helmhive.policy.runners.pool import PoolRef
from helmhive.runner.jobs.podclaim import (
    StartedPod,
    build_warm_selector,
    decide_claim_order,
    decide_pod_start,
    ensure_job_pod,
    read_job_pod_outcome,
    remove_job_pod,
    remove_job_pods,
    wait_job_pod,
)
from helmhive.runner.kube import Conflict, RunnerKube

POOL = "pool-a"
SPEC: dict[str, Any] = {
    "provider": "anthropic",
    "adapter": {"type": "acp", "acp": {"command": "helmhive-reference-agent"}},
    "image": "ghcr.io/helmhive/runner:test",
    "credential": {"secretRef": {"name": "pool-a-credential", "key": "api-key"}, "envName": "ANTHROPIC_API_KEY"},
    "execution": {"mode": "JobPod", "warmPods": 1},
}
POD_RULES = [
    client.V1PolicyRule(
        api_groups=[""], resources=["pods"], verbs=["get", "list", "watch", "create", "patch", "delete"]
    ),
    client.V1PolicyRule(api_groups=[GROUP], resources=["agentjobs/finalizers"], verbs=["update"]),
]
"""What a JobPod pool's runner Role adds about pods (the operator's side writes it)."""
NOW = dt.datetime.now


def _container(name: str, state: dict[str, Any], *, ready: bool) -> dict[str, Any]:
    return {"name": name, "image": SPEC["image"], "imageID": "", "ready": ready, "restartCount": 0, "state": state}


class Cluster:
    """The operator's and the kubelet's parts, with the admin client."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "RunnerPool", "metadata": {"name": POOL}, "spec": SPEC}
        created = kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "runnerpools", body)
        self.pool = PoolRef(name=POOL, namespace=namespace, uid=created["metadata"]["uid"])
        warm = build_job_pod(
            pool=self.pool,
            pool_spec=RunnerPoolSpec.model_validate(SPEC),
            namespace=namespace,
            job=None,
            runner=None,
            timeout_seconds=None,
        )
        self.template: dict[str, Any] = json.loads(json.dumps(warm))  # as runner.json carries it

    def job(self, name: str) -> JobRef:
        spec = {"workspace": "shop", "jobKind": "review-probe", "request": {"title": "t", "prompt": "p"}}
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentJob", "metadata": {"name": name}, "spec": spec}
        created = self.kube.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, "agentjobs", body)
        return JobRef(name=name, uid=created["metadata"]["uid"])

    def warm_pod(self, *, pool: PoolRef | None = None, finalizer: bool = False) -> str:
        body = copy.deepcopy(self.template)
        if pool is not None:  # another pool's
            body["metadata"]["labels"]["helmhive.dev/pool"] = pool.name
        if finalizer:
            body["metadata"]["finalizers"] = ["helmhive.test/hold"]
        return str(self.kube.core.create_namespaced_pod(self.namespace, body).metadata.name)

    def pod(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.kube.api_client.sanitize_for_serialization(
            self.kube.core.read_namespaced_pod(name, self.namespace)
        )
        return found

    def set_status(self, name: str, *, ip: str | None = "10.0.7.3", shim: str = "running", **extra: Any) -> None:
        """What the kubelet would report: the pod Running (an address) with its shim's state."""
        states = {
            "running": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
            "pulling": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}},
            "creating": {"waiting": {"reason": "ContainerCreating"}},
        }
        ready = shim == "running"
        status: dict[str, Any] = {
            "phase": "Running",
            "startTime": "2026-01-01T00:00:00Z",
            "containerStatuses": [_container(c, states[shim], ready=ready) for c in (SHIM_CONTAINER, AGENT_CONTAINER)],
            **extra,
        }
        if ip is not None:
            status.update({"podIP": ip, "podIPs": [{"ip": ip}]})
        self.kube.core.patch_namespaced_pod_status(name, self.namespace, {"status": status})

    def release(self, name: str) -> None:
        self.kube.core.patch_namespaced_pod(name, self.namespace, {"metadata": {"finalizers": None}})


@pytest.fixture
def cluster_rig(kube: Kube, namespace: str, crds: list[str]) -> Cluster:
    return Cluster(kube, namespace)


@pytest.fixture
async def runners(
    kube: Kube, namespace: str, service_account_identity: IdentityFactory
) -> AsyncIterator[Callable[[str], RunnerKube]]:
    """``runners(name)``: a runner's API wrapper, as ServiceAccount ``name`` with the pod rules."""
    role = client.V1Role(metadata=client.V1ObjectMeta(name="jobpod-runner"), rules=POD_RULES)
    client.RbacAuthorizationV1Api(kube.api_client).create_namespaced_role(namespace, role)
    made: list[tuple[Identity, RunnerKube]] = []

    def make(name: str) -> RunnerKube:
        who = service_account_identity(namespace, name)
        binding = client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name=f"jobpod-{name}"),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="jobpod-runner"),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name=name, namespace=namespace)],
        )
        client.RbacAuthorizationV1Api(kube.api_client).create_namespaced_role_binding(namespace, binding)
        runner = RunnerKube(who.api_client(), namespace=namespace)
        made.append((who, runner))
        return runner

    yield make
    for _, runner in made:
        runner.close()


def _owners(pod: dict[str, Any]) -> list[tuple[str, str]]:
    return [(o["kind"], o["uid"]) for o in pod["metadata"].get("ownerReferences") or []]


def _pod(phase: str = "Running", *, ip: str = "10.0.7.3", shim: dict[str, Any] | None = None, **status: Any) -> Any:
    shim_state = {"running": {}} if shim is None else shim
    return {
        "metadata": {"name": "pool-a-job-x", "labels": {"helmhive.dev/pool": POOL, LABEL_WARM: "true"}},
        "status": {
            "phase": phase,
            "podIP": ip,
            "containerStatuses": [_container(SHIM_CONTAINER, shim_state, ready=shim is None)],
            **status,
        },
    }


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (_pod(), StartedPod(name="pool-a-job-x", ip="10.0.7.3")),
        (_pod("Pending", ip=""), None),
        (_pod(ip=""), None),
        (_pod(shim={"waiting": {"reason": "ContainerCreating"}}), None),
        (_pod(shim={"waiting": {"reason": "ImagePullBackOff"}}), "JobPodFailed:ImagePullBackOff"),
        (_pod("Failed", reason="DeadlineExceeded"), "TimedOut"),
        (_pod("Failed", reason="Evicted"), "JobPodLost:Evicted"),
        (_pod("Succeeded"), "JobPodLost:Ended"),
        (None, "JobPodLost"),
    ],
    ids=["started", "pending", "no-address", "creating", "no-image", "deadline", "evicted", "ended", "gone"],
)
def test_what_a_pods_state_means_before_its_job_runs(pod: Any, expected: StartedPod | str | None) -> None:
    decided = decide_pod_start(pod)
    if isinstance(expected, str):
        assert isinstance(decided, JobPodOutcome) and decided.reason == expected
    else:
        assert decided == expected


def test_the_warm_pods_worth_claiming_the_longest_started_first() -> None:
    def warm(name: str, started: str | None, **changes: Any) -> dict[str, Any]:
        pod = _pod(startTime=started) if started else _pod("Pending")
        pod["metadata"] = {**pod["metadata"], "name": name, **changes}
        return pod

    claimed = warm("claimed", "2026-01-01T00:00:01Z", labels={"helmhive.dev/job": "x"})
    leaving = warm("leaving", "2026-01-01T00:00:01Z", deletionTimestamp="2026-01-01T00:01:00Z")
    pods = [warm("new", "2026-01-01T00:05:00Z"), warm("old", "2026-01-01T00:00:00Z"), warm("pending", None)]
    assert [v.name for v in decide_claim_order([*pods, claimed, leaving])] == ["old", "new"]
    assert build_warm_selector(POOL) == (
        f"app.kubernetes.io/name=helmhive-job,helmhive.dev/pool={POOL},{LABEL_WARM}=true"
    )


async def test_two_runners_racing_for_one_warm_pod_claim_it_once(
    cluster_rig: Cluster, runners: Callable[[str], RunnerKube]
) -> None:
    warm = cluster_rig.warm_pod()
    cluster_rig.set_status(warm)
    one, two = runners("pool-a-0"), runners("pool-a-1")
    alpha, beta = cluster_rig.job("alpha"), cluster_rig.job("beta")

    # Both read the warm pod, then both claim what they read: one claim wins, the other is refused (409).
    listed = await one.list_pods(label_selector=build_warm_selector(POOL))
    (read,) = decide_claim_order(listed)
    claims = [
        kube.merge_patch_pod(
            read.name,
            build_claim_patch(
                pod=read, job_name=job.name, job_uid=job.uid, runner=runner, timeout_seconds=600, now=NOW(dt.UTC)
            ),
        )
        for kube, job, runner in ((one, alpha, "pool-a-0"), (two, beta, "pool-a-1"))
    ]
    won, lost = sorted(await asyncio.gather(*claims, return_exceptions=True), key=lambda r: isinstance(r, Exception))
    assert isinstance(won, dict) and isinstance(lost, Conflict), (won, lost)
    assert LABEL_WARM not in won["metadata"]["labels"]

    # What a runner does about it: the loser finds no warm pod left and creates one for its job.
    cluster_rig.kube.core.delete_namespaced_pod(warm, cluster_rig.namespace, grace_period_seconds=0)
    again = cluster_rig.warm_pod()
    cluster_rig.set_status(again)
    gamma, delta = cluster_rig.job("gamma"), cluster_rig.job("delta")
    got = await asyncio.gather(
        ensure_job_pod(
            kube=one, template=cluster_rig.template, pool=POOL, job=gamma, runner="pool-a-0",
            timeout_seconds=600, now=lambda: NOW(dt.UTC),
        ),
        ensure_job_pod(
            kube=two, template=cluster_rig.template, pool=POOL, job=delta, runner="pool-a-1",
            timeout_seconds=900, now=lambda: NOW(dt.UTC),
        ),
    )  # fmt: skip
    assert sorted(g.claimed for g in got) == [False, True]
    assert [g.name for g in got if g.claimed] == [again]
    for acquired, job, runner, timeout in ((got[0], gamma, "pool-a-0", 600), (got[1], delta, "pool-a-1", 900)):
        pod = cluster_rig.pod(acquired.name)
        labels = pod["metadata"]["labels"]
        assert LABEL_WARM not in labels and (labels[LABEL_JOB], labels[LABEL_RUNNER]) == (job.name, runner)
        assert _owners(pod) == [("AgentJob", job.uid)]
        deadline = pod["spec"]["activeDeadlineSeconds"]
        assert timeout + DEADLINE_MARGIN_SECONDS <= deadline  # a claimed pod's also counts the time it ran
        if not acquired.claimed:
            assert acquired.name.startswith(f"{POOL}-job-") and deadline == timeout + DEADLINE_MARGIN_SECONDS


async def test_only_a_running_warm_pod_of_the_pool_is_claimed(
    cluster_rig: Cluster, runners: Callable[[str], RunnerKube], namespace: str
) -> None:
    pending = cluster_rig.warm_pod()  # never started
    other = cluster_rig.warm_pod(pool=PoolRef(name="pool-b", namespace=namespace, uid="x"))
    cluster_rig.set_status(other)
    leaving = cluster_rig.warm_pod(finalizer=True)
    cluster_rig.set_status(leaving)
    cluster_rig.kube.core.delete_namespaced_pod(leaving, namespace)
    wait_for(lambda: PodView.parse(cluster_rig.pod(leaving)).deleting, timeout=30, describe="a pod being deleted")
    kube = runners("pool-a-0")
    try:
        job = cluster_rig.job("alpha")
        got = await ensure_job_pod(
            kube=kube, template=cluster_rig.template, pool=POOL, job=job, runner="pool-a-0",
            timeout_seconds=60, now=lambda: NOW(dt.UTC),
        )  # fmt: skip
        assert not got.claimed and got.name not in (pending, other, leaving)
        for untouched in (pending, other):
            assert LABEL_WARM in cluster_rig.pod(untouched)["metadata"]["labels"]
    finally:
        cluster_rig.release(leaving)


async def _acquire(kube: RunnerKube, rig: Cluster, job: JobRef, *, runner: str = "pool-a-0") -> str:
    """A pod for ``job`` (claimed or created) by ``runner``: its name."""
    got = await ensure_job_pod(
        kube=kube, template=rig.template, pool=POOL, job=job, runner=runner,
        timeout_seconds=60, now=lambda: NOW(dt.UTC),
    )  # fmt: skip
    return got.name


async def test_the_runner_waits_for_its_pod_to_run_and_reads_why_it_cannot(
    cluster_rig: Cluster, runners: Callable[[str], RunnerKube], namespace: str
) -> None:
    kube = runners("pool-a-0")
    job = cluster_rig.job("alpha")

    async def acquire() -> str:
        return await _acquire(kube, cluster_rig, job)

    # Started: waits through a pod without an address and a shim still being created.
    name = await acquire()
    waiting = asyncio.create_task(wait_job_pod(kube, name, timeout_seconds=300))
    cluster_rig.set_status(name, ip=None, shim="creating")
    await asyncio.sleep(1.0)
    assert not waiting.done()
    cluster_rig.set_status(name, ip="10.0.7.3", shim="running")
    assert await asyncio.wait_for(waiting, 60) == StartedPod(name=name, ip="10.0.7.3")
    assert await read_job_pod_outcome(kube, name) is None  # a running pod says nothing against its job

    # A container that will not start: JobPodFailed with its reason.
    failing = await acquire()
    waiting = asyncio.create_task(wait_job_pod(kube, failing, timeout_seconds=300))
    cluster_rig.set_status(failing, shim="pulling")
    failed = await asyncio.wait_for(waiting, 60)
    assert isinstance(failed, JobPodOutcome) and failed.reason == "JobPodFailed:ImagePullBackOff"

    # Deleted while the runner waits: JobPodLost.
    lost = await acquire()
    waiting = asyncio.create_task(wait_job_pod(kube, lost, timeout_seconds=300))
    await asyncio.sleep(0.5)
    assert await remove_job_pod(kube, lost)
    gone = await asyncio.wait_for(waiting, 60)
    # Seen being deleted (a pod bound to a node waits for its kubelet) or already gone: lost either way.
    assert isinstance(gone, JobPodOutcome) and gone.reason in {"JobPodLost", "JobPodLost:Deleted"}
    assert not await remove_job_pod(kube, lost)  # gone already is done

    # The agent's container killed at its memory limit, read once after the link broke.
    oom_killed = {"terminated": {"reason": "OOMKilled", "exitCode": 137}}
    cluster_rig.kube.core.patch_namespaced_pod_status(
        name,
        namespace,
        {"status": {"containerStatuses": [_container(AGENT_CONTAINER, oom_killed, ready=False)]}},
    )
    oom = await read_job_pod_outcome(kube, name)
    assert oom is not None and oom.reason == "ResourceLimitExceeded:memory"
    assert await remove_job_pod(kube, name)
    assert (await read_job_pod_outcome(kube, name)).reason in {"JobPodLost", "JobPodLost:Deleted"}  # type: ignore[union-attr]


async def test_a_pod_not_started_within_the_pools_timeout_fails_its_job_with_why(
    cluster_rig: Cluster, runners: Callable[[str], RunnerKube], namespace: str
) -> None:
    kube = runners("pool-a-0")
    job = cluster_rig.job("alpha")

    async def acquire() -> str:
        return await _acquire(kube, cluster_rig, job)

    # What the scheduler writes when no node fits: the job fails once the timer fires, with its message.
    stuck = await acquire()
    said = "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector."
    unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": said}
    cluster_rig.kube.core.patch_namespaced_pod_status(
        stuck, namespace, {"status": {"phase": "Pending", "conditions": [unschedulable]}}
    )
    failed = await asyncio.wait_for(wait_job_pod(kube, stuck, timeout_seconds=2), 60)
    assert isinstance(failed, JobPodOutcome), failed
    assert failed.reason == "JobPodFailed:Unschedulable"
    assert failed.message == f"pod {stuck} was not scheduled within 2 s (execution.startTimeoutSeconds): {said}"
    assert not [t for t in threading.enumerate() if t.name == f"watch-pod-{stuck}"], "the timer ended the watch"

    # Scheduled, its containers still being created: StartTimeout, naming what it waits for.
    slow = await acquire()
    cluster_rig.set_status(slow, ip=None, shim="creating", phase="Pending")
    late = await asyncio.wait_for(wait_job_pod(kube, slow, timeout_seconds=2), 60)
    assert isinstance(late, JobPodOutcome) and late.reason == "JobPodFailed:StartTimeout"
    assert "container shim ContainerCreating" in late.message

    # Started before the timer fires: the same wait returns the pod.
    quick = await acquire()
    waiting = asyncio.create_task(wait_job_pod(kube, quick, timeout_seconds=120))
    cluster_rig.set_status(quick, ip="10.0.7.9", shim="running")
    assert await asyncio.wait_for(waiting, 60) == StartedPod(name=quick, ip="10.0.7.9")


async def test_a_cancelled_wait_ends_its_watch(cluster_rig: Cluster, runners: Callable[[str], RunnerKube]) -> None:
    kube = runners("pool-a-0")
    job = cluster_rig.job("alpha")
    got = await ensure_job_pod(
        kube=kube, template=cluster_rig.template, pool=POOL, job=job, runner="pool-a-0",
        timeout_seconds=60, now=lambda: NOW(dt.UTC),
    )  # fmt: skip
    waiting = asyncio.create_task(wait_job_pod(kube, got.name, timeout_seconds=300))
    await asyncio.sleep(0.5)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert not [t for t in threading.enumerate() if t.name == f"watch-pod-{got.name}"]


async def test_a_lost_jobs_pods_are_found_by_their_labels_and_removed_by_their_owner(
    cluster_rig: Cluster, runners: Callable[[str], RunnerKube]
) -> None:
    kube = runners("pool-a-0")
    alpha, beta = cluster_rig.job("alpha"), cluster_rig.job("beta")

    async def acquire(job: JobRef, runner: str = "pool-a-0") -> str:
        return await _acquire(kube, cluster_rig, job, runner=runner)

    mine, others, elsewhere = await acquire(alpha), await acquire(beta), await acquire(alpha, runner="pool-a-1")
    # Labelled as alpha's (a label holds 63 characters of a name), owned by another job: not alpha's.
    # (Owned by beta as it exists: an owner reference whose name and uid disagree is one the garbage
    # collector treats as gone, and it would delete the pod.)
    lookalike = build_cold_job_pod(cluster_rig.template, job=beta, runner="pool-a-0", timeout_seconds=60)
    lookalike["metadata"]["labels"]["helmhive.dev/job"] = "alpha"
    alike = cluster_rig.kube.core.create_namespaced_pod(cluster_rig.namespace, lookalike).metadata.name
    assert await remove_job_pods(kube, pool=POOL, job=alpha, runner="pool-a-0") == [mine]
    for kept in (others, elsewhere, alike):
        assert cluster_rig.pod(kept)["metadata"]["name"] == kept
    assert await remove_job_pods(kube, pool=POOL, job=alpha, runner="pool-a-0") == []
