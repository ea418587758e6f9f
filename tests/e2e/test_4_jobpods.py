"""JobPod mode on real pods: each job in a Pod of its own, started by a kubelet, reaching only its
runner's proxy through kube-router's enforcement, with a warm pod claimed and the credential
never inside. Runs after the change module and before the upgrade/uninstall module.

The pool's job pods take a RuntimeClass (``execution.runtimeClassName``) whose scheduling places
them on the control-plane node, while its runner pod runs on the worker: every job here crosses a
node boundary to its runner's proxy, as a gVisor or Kata node pool would make it do."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from e2e_rig import RUNNERS_NS, Rig

from harness.wait import wait_for

POOL = "jobpod"
PROFILE = "jobpod-check"
RESUME_PROFILE = "jobpod-resume"
RUNTIME_CLASS = "helmhive-e2e-far"
CANARY = "canary-provider-key-7d41e0b2-jobpod"
SESSION_CANARY = "canary-sid-jobpod-e2e"
AGENT_STATE = "~/.reference-agent"
"""The reference agent keeps its sessions in its HOME: a job pod's is the binding's, kept by the runner."""
LABEL_JOB = "helmhive.dev/job"
LABEL_WARM = "helmhive.dev/warm"
LABEL_POOL = "helmhive.dev/pool"
MEMORY = 256 * 1024 * 1024
_API = "helmhive.dev/v1alpha1"


def _documents(image: str, control_plane: str) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": RUNTIME_CLASS},
            "handler": "runc",
            "scheduling": {
                "nodeSelector": {"kubernetes.io/hostname": control_plane},
                "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}],
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "jobpod-token"},
            "stringData": {"token": CANARY},
        },
        {
            "apiVersion": _API,
            "kind": "RunnerPool",
            "metadata": {"name": POOL},
            "spec": {
                "provider": "reference",
                "adapter": {
                    "type": "acp",
                    "acp": {
                        "command": "helmhive-reference-agent",
                        "env": [
                            {"name": "HELMHIVE_REFERENCE_AGENT_SLOW_STEPS", "value": "60"},
                            {"name": "HELMHIVE_REFERENCE_AGENT_SLOW_INTERVAL", "value": "0.5"},
                            {"name": "HELMHIVE_REFERENCE_AGENT_STATE_DIR", "value": AGENT_STATE},
                            {"name": "HELMHIVE_REFERENCE_AGENT_SESSION_PREFIX", "value": SESSION_CANARY},
                        ],
                    },
                },
                "image": image,
                "imagePullPolicy": "Never",
                "credential": {
                    "secretRef": {"name": "jobpod-token", "key": "token"},
                    "envName": "HELMHIVE_REFERENCE_AGENT_TOKEN",
                },
                "credentialIsolation": "Proxy",
                "placementLabels": {"domain": "code", "execution": "jobpod"},
                "capabilities": ["structured-output", "workspace-write"],
                "concurrency": 3,
                "replicas": 1,
                # The nodes share two cores: a job pod asks for a quarter of one.
                "jobLimits": {"memoryBytes": MEMORY, "cpuMillicores": 250, "diskBytes": 512 * 1024 * 1024},
                "execution": {"mode": "JobPod", "warmPods": 1, "runtimeClassName": RUNTIME_CLASS},
            },
        },
        {
            "apiVersion": _API,
            "kind": "Profile",
            "metadata": {"name": PROFILE},
            "spec": {
                "envelope": "connection-test",
                "purpose": "Prove a job pod answers.",
                "instructions": "Reply with one short sentence.",
                "providerMappings": [{"provider": "reference"}],
                "requiredLabels": {"execution": "jobpod"},
            },
        },
        {
            "apiVersion": _API,
            "kind": "Profile",
            "metadata": {"name": RESUME_PROFILE},
            "spec": {
                "envelope": "implementation-probe",
                "purpose": "Continue one session across jobs, each in a pod of its own.",
                "instructions": "Remember what you did before.",
                "providerMappings": [{"provider": "reference"}],
                "requiredLabels": {"execution": "jobpod"},
                "session": {"policy": "resume"},
            },
        },
    ]


def _job(
    name: str, prompt: str, *, timeout: int = 300, kind: str = "connection-test", profile: str = PROFILE
) -> dict[str, Any]:
    return {
        "apiVersion": _API,
        "kind": "AgentJob",
        "metadata": {"name": name},
        "spec": {
            "workspace": "payments",
            "jobKind": kind,
            "profile": profile,
            "request": {"title": name, "prompt": prompt},
            "timeoutSeconds": timeout,
        },
    }


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind), {})


def _ended(rig: Rig, name: str) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        job = rig.get("agentjob", "-n", RUNNERS_NS, name)
        ready = _condition(job, "Ready")
        return job if ready.get("status") in {"True", "False"} and ready.get("reason") != "Started" else None

    found: dict[str, Any] = wait_for(ended, timeout=420, describe=f"job {name} to end")
    return found


def _pods(rig: Rig, selector: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = rig.get("pods", "-n", RUNNERS_NS, "-l", selector)["items"]
    return items


def _running_pod_of(rig: Rig, job: str) -> dict[str, Any]:
    def running() -> dict[str, Any] | None:
        pods = [p for p in _pods(rig, f"{LABEL_JOB}={job}") if p.get("status", {}).get("phase") == "Running"]
        return pods[0] if pods else None

    found: dict[str, Any] = wait_for(running, timeout=300, describe=f"the job pod of {job} to run")
    return found


def _events_of(rig: Rig, job: str) -> list[dict[str, Any]]:
    items = rig.get("events", "-n", RUNNERS_NS, "--field-selector", f"involvedObject.name={job}")["items"]
    return [e for e in items if e["involvedObject"]["kind"] == "AgentJob"]


def _schedulable(rig: Rig, runner: str) -> bool:
    found = [r for r in rig.get("runners", "-n", RUNNERS_NS)["items"] if r["metadata"]["name"] == runner]
    return any(
        c["type"] == "Schedulable" and c["status"] == "True" for r in found for c in r["status"].get("conditions", [])
    )


def _control_plane(rig: Rig) -> str:
    return next(n for n in rig.env.nodes if n.endswith("control-plane"))


@pytest.fixture(scope="module")
def jobpods(runners: Rig) -> Iterator[Rig]:
    rig = runners
    rig.apply(_documents(rig.env.images.runner, _control_plane(rig)), RUNNERS_NS)
    # The reference pool's runner has the same provider and not the label: a job routed before
    # this pool's runner registers fails closed at once (MissingLabel), as routing says it must.
    wait_for(lambda: _schedulable(rig, f"{POOL}-0"), timeout=300, describe=f"runner {POOL}-0 Schedulable")
    wait_for(
        lambda: any(c.get("ready") for p in _pods(rig, f"{LABEL_POOL}={POOL},{LABEL_WARM}=true")
                    for c in p.get("status", {}).get("containerStatuses", [])),
        timeout=300, describe="a warm job pod of the pool to be ready",
    )  # fmt: skip
    yield rig


def test_a_job_runs_in_a_warm_pod_of_its_own_and_nothing_runs_after(jobpods: Rig) -> None:
    rig = jobpods
    warm = {p["metadata"]["name"] for p in _pods(rig, f"{LABEL_POOL}={POOL},{LABEL_WARM}=true")}
    rig.apply([_job("jp-hello", "REFERENCE-AGENT: slow\nSay hello.")], RUNNERS_NS)
    pod = _running_pod_of(rig, "jp-hello")
    name = pod["metadata"]["name"]
    assert name in warm, f"{name} was not one of the warm pods {warm}: the claim created a cold one"
    spec = pod["spec"]
    # The envelope as a Pod: no token, restricted, limits equal to requests, a disk limit.
    assert spec["automountServiceAccountToken"] is False
    agent = next(c for c in spec["containers"] if c["name"] == "agent")
    assert agent["resources"]["limits"]["memory"] == agent["resources"]["requests"]["memory"] == str(MEMORY)
    assert agent["securityContext"]["readOnlyRootFilesystem"] is True
    assert agent["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert any(v.get("emptyDir", {}).get("sizeLimit") for v in spec["volumes"] if v["name"] == "job")
    assert spec.get("activeDeadlineSeconds", 0) > 0
    owners = pod["metadata"]["ownerReferences"]
    assert [o["kind"] for o in owners] == ["AgentJob"] and owners[0]["name"] == "jp-hello"
    # Nothing of the provider key in the pod's spec, in any container's environment.
    assert CANARY not in json.dumps(pod)
    job = _ended(rig, "jp-hello")
    assert _condition(job, "Ready").get("reason") == "Completed", job["status"]
    events = _events_of(rig, "jp-hello")
    assert any(name in e.get("message", "") for e in events), [e.get("message") for e in events]
    # Used once, then deleted; the warm set is refilled with another pod.
    wait_for(
        lambda: not [p for p in _pods(rig, f"{LABEL_JOB}=jp-hello") if p["status"].get("phase") == "Running"],
        timeout=120, describe="the claimed pod to be gone after the job",
    )  # fmt: skip
    refill = wait_for(
        lambda: [p for p in _pods(rig, f"{LABEL_POOL}={POOL},{LABEL_WARM}=true") if p["metadata"]["name"] != name],
        timeout=300, describe="a new warm pod",
    )  # fmt: skip
    assert refill


def _exec(rig: Rig, pod: str, container: str, code: str) -> str:
    return rig.exec_python(RUNNERS_NS, pod, code, container=container)


_SWEEP = (
    # The needle arrives hex-encoded, so this script's own command line does not hold it.
    "import os\n"
    "NEEDLE = bytes.fromhex(HEX)\n"
    "hits = []\n"
    "for pid in os.listdir('/proc'):\n"
    "    if pid.isdigit() and int(pid) != os.getpid():\n"
    "        for part in ('environ', 'cmdline'):\n"
    "            try:\n"
    "                if NEEDLE in open(f'/proc/{pid}/{part}', 'rb').read(): hits.append(f'/proc/{pid}/{part}')\n"
    "            except OSError: pass\n"
    "for root in ('/job', '/tmp', '/run', '/etc', '/var', '/home', '/shim'):\n"
    "    for d, _, files in os.walk(root):\n"
    "        for f in files:\n"
    "            p = os.path.join(d, f)\n"
    "            try:\n"
    "                if NEEDLE in open(p, 'rb').read(1 << 22): hits.append(p)\n"
    "            except OSError: pass\n"
    "print('hits', hits)\n"
)


def test_the_provider_key_is_nowhere_in_the_job_pod(jobpods: Rig) -> None:
    rig = jobpods
    rig.apply([_job("jp-sweep", "REFERENCE-AGENT: slow\nPROVIDER-CALL: /v1/messages\nSay hello.")], RUNNERS_NS)
    pod = _running_pod_of(rig, "jp-sweep")["metadata"]["name"]
    code = _SWEEP.replace("HEX", repr(CANARY.encode().hex()))
    for container in ("agent", "shim"):
        out = _exec(rig, pod, container, code)
        assert out == "hits []", f"{container}: {out}"
    job = _ended(rig, "jp-sweep")
    logs = rig.kubectl("logs", "-n", RUNNERS_NS, pod, "--all-containers", check=False)
    events = rig.get("events", "-n", RUNNERS_NS)["items"]
    assert CANARY not in json.dumps(job) + logs + json.dumps(events)


def test_a_job_pod_reaches_only_its_runners_proxy(jobpods: Rig) -> None:
    rig = jobpods
    rig.apply([_job("jp-net", "REFERENCE-AGENT: slow\nSay hello.")], RUNNERS_NS)
    pod = _running_pod_of(rig, "jp-net")
    runner_pod = rig.get("pod", "-n", RUNNERS_NS, pod["metadata"]["labels"]["helmhive.dev/runner"])
    runner_ip = runner_pod["status"]["podIP"]
    api = rig.get("service", "-n", "default", "kubernetes")["spec"]["clusterIP"]
    other = rig.get("pod", "-n", RUNNERS_NS, "reference-0")["status"]["podIP"]
    name = pod["metadata"]["name"]
    assert rig.probe(RUNNERS_NS, name, runner_ip, 7471).startswith("open"), "the runner's proxy port"
    for host, port, what in (
        (api, 443, "the API server"),
        (runner_ip, 9090, "the runner's metrics port"),
        (other, 7471, "another runner pod"),
        ("192.0.2.10", 443, "an outside address"),
    ):
        verdict = rig.exec_python(RUNNERS_NS, name, _probe(host, port), container="agent")
        assert verdict.startswith("closed"), f"{what} ({host}:{port}) was reachable: {verdict}"
    # The RuntimeClass put the job pod on the control-plane node, away from its runner: across
    # nodes, kube-router lets it reach its runner's proxy and nothing else.
    assert pod["spec"]["nodeName"] == _control_plane(rig) != runner_pod["spec"]["nodeName"], pod["spec"]
    assert pod["spec"]["runtimeClassName"] == RUNTIME_CLASS
    job = _ended(rig, "jp-net")
    assert _condition(job, "Ready").get("reason") == "Completed", job["status"]


def _probe(host: str, port: int) -> str:
    return (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(({host!r}, {port}), timeout=4).close(); print('open')\n"
        "except OSError as e:\n"
        "    print('closed', type(e).__name__)\n"
    )


def test_a_job_pod_killed_for_memory_ends_its_job_with_the_limit(jobpods: Rig) -> None:
    rig = jobpods
    rig.apply([_job("jp-oom", "ALLOCATE: 1024\nSay hello.")], RUNNERS_NS)
    job = _ended(rig, "jp-oom")
    ready = _condition(job, "Ready")
    assert ready.get("status") == "False"
    assert ready.get("reason") == "ResourceLimitExceeded:memory", job["status"]


def test_a_job_pod_deleted_mid_run_is_named_lost(jobpods: Rig) -> None:
    rig = jobpods
    rig.apply([_job("jp-lost", "REFERENCE-AGENT: slow\nSay hello.")], RUNNERS_NS)
    pod = _running_pod_of(rig, "jp-lost")["metadata"]["name"]
    rig.kubectl("delete", "pod", "-n", RUNNERS_NS, pod, "--wait=false")
    # A connection test is read-only: the loss is re-run under the retry rules, and named.
    wait_for(
        lambda: any("JobPodLost" in (e.get("reason", "") + e.get("message", "")) for e in _events_of(rig, "jp-lost")),
        timeout=300, describe="an Event naming JobPodLost",
    )  # fmt: skip
    job = _ended(rig, "jp-lost")
    assert _condition(job, "Ready").get("reason") in {"Completed", "JobPodLost"}, job["status"]
    # Nothing is left of it: every pod the job had is deleted (a terminating one goes within its grace).
    wait_for(lambda: not _pods(rig, f"{LABEL_JOB}=jp-lost"), timeout=120, describe="jp-lost's pods to be gone")


def test_a_burst_of_jobs_each_get_a_pod_and_none_is_left(jobpods: Rig) -> None:
    rig = jobpods
    names = [f"jp-burst-{i}" for i in range(4)]
    rig.apply([_job(n, "Say hello.") for n in names], RUNNERS_NS)
    for n in names:
        job = _ended(rig, n)
        assert _condition(job, "Ready").get("reason") == "Completed", job["status"]
    leftover = [
        p["metadata"]["name"] for p in _pods(rig, f"{LABEL_POOL}={POOL}") if LABEL_JOB in p["metadata"]["labels"]
    ]
    wait_for(
        lambda: not [p for p in _pods(rig, f"{LABEL_POOL}={POOL}") if LABEL_JOB in p["metadata"]["labels"]
                     and p["status"].get("phase") == "Running"],
        timeout=120, describe=f"no claimed job pod left running (were {leftover})",
    )  # fmt: skip


def _turn(job: dict[str, Any]) -> int:
    line = next(line for line in job["status"]["result"]["summary"].splitlines() if line.startswith("turn="))
    return int(line.split()[0].removeprefix("turn="))


def test_a_session_resumes_across_two_jobs_each_in_its_own_pod(jobpods: Rig) -> None:
    rig = jobpods
    ended = []
    for name in ("jp-resume-1", "jp-resume-2"):
        job = _job(name, f"Job {name}.", kind="implementation-probe", profile=RESUME_PROFILE)
        rig.apply([job], RUNNERS_NS)
        ended.append(_ended(rig, name))
        assert _condition(ended[-1], "Ready").get("reason") == "Completed", ended[-1]["status"]
    first, second = ended
    binding = first["status"]["session"]["binding"]
    assert first["status"]["session"] == {"binding": binding, "mode": "fresh"} and _turn(first) == 1
    # The second job's agent, in a new pod, loaded the first one's session from the HOME its runner kept.
    assert second["status"]["session"] == {"binding": binding, "mode": "resumed"}, second["status"]
    assert _turn(second) == 2
    pods = {j["status"]["result"]["jobPod"]["name"] for j in ended}
    assert len(pods) == 2, pods
    # The native session id stays in the runner's Secret: not in the jobs, their Events or the binding.
    binding_obj = rig.get("sessionbinding", "-n", RUNNERS_NS, binding)
    events = rig.get("events", "-n", RUNNERS_NS)["items"]
    assert SESSION_CANARY not in json.dumps(ended) + json.dumps(events) + json.dumps(binding_obj)


def test_a_warm_pod_that_cannot_start_is_named_on_its_pool(jobpods: Rig) -> None:
    rig = jobpods
    # The pool's own spec, with an image no node has and may not pull, and no runner pod.
    (broken,) = copy.deepcopy([d for d in _documents(rig.env.images.runner, "") if d["kind"] == "RunnerPool"])
    broken["metadata"]["name"] = "jobpod-broken"
    broken["spec"] |= {"image": "helmhive.local/absent:none", "replicas": 0, "placementLabels": {"broken": "yes"}}
    broken["spec"]["execution"] = {"mode": "JobPod", "warmPods": 1}
    rig.apply([broken], RUNNERS_NS)

    def failing() -> dict[str, Any] | None:
        pool = rig.get("runnerpool", "-n", RUNNERS_NS, "jobpod-broken")
        cond = _condition(pool, "WarmPodsReady")
        return cond if cond.get("reason") == "WarmPodFailing" else None

    # The kubelet's own reason for the image it may not pull, on the pool a platform team watches.
    cond = wait_for(failing, timeout=300, describe="jobpod-broken WarmPodsReady=False WarmPodFailing")
    assert cond["status"] == "False" and "ErrImageNeverPull" in cond["message"], cond
    # The working pool beside it says its warm set is ready (once its last claim's pod is replaced).
    wait_for(
        lambda: _condition(rig.get("runnerpool", "-n", RUNNERS_NS, POOL), "WarmPodsReady").get("reason")
        == "WarmPodsReady",
        timeout=300, describe=f"{POOL} WarmPodsReady",
    )  # fmt: skip
    rig.kubectl("delete", "runnerpool", "-n", RUNNERS_NS, "jobpod-broken", "--wait=false")


NOWHERE = "helmhive-e2e-nowhere"


def test_a_job_pod_no_node_can_take_fails_its_job_at_the_pools_start_timeout(jobpods: Rig) -> None:
    rig = jobpods
    # A RuntimeClass whose scheduling names a node label no node has: the scheduler finds no node.
    runtime = {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": NOWHERE},
        "handler": "runc",
        "scheduling": {"nodeSelector": {"helmhive.dev/e2e-no-such-node": "true"}},
    }
    docs = copy.deepcopy(_documents(rig.env.images.runner, ""))
    (pool,) = [d for d in docs if d["kind"] == "RunnerPool"]
    (profile,) = [d for d in docs if d["kind"] == "Profile" and d["metadata"]["name"] == PROFILE]
    pool["metadata"]["name"] = profile["metadata"]["name"] = "jobpod-nowhere"
    pool["spec"] |= {"placementLabels": {"domain": "code", "execution": "nowhere"}, "concurrency": 1}
    pool["spec"]["execution"] = {"mode": "JobPod", "runtimeClassName": NOWHERE, "startTimeoutSeconds": 15}
    profile["spec"]["requiredLabels"] = {"execution": "nowhere"}
    rig.apply([runtime])
    rig.apply([pool, profile], RUNNERS_NS)
    try:
        wait_for(lambda: _schedulable(rig, "jobpod-nowhere-0"), timeout=300, describe="runner jobpod-nowhere-0")
        rig.apply([_job("jp-nowhere", "Say hello.", profile="jobpod-nowhere")], RUNNERS_NS)
        job = _ended(rig, "jp-nowhere")
        ready = _condition(job, "Ready")
        # The scheduler's own words, on the job, once the pool's start timeout passed; not the job's timeout.
        assert (ready.get("status"), ready.get("reason")) == ("False", "JobPodFailed:Unschedulable"), job["status"]
        assert "not scheduled within 15 s" in ready["message"], ready
        assert "node affinity/selector" in ready["message"], ready
        wait_for(lambda: not _pods(rig, f"{LABEL_JOB}=jp-nowhere"), timeout=120, describe="jp-nowhere's pod gone")
    finally:
        rig.kubectl("delete", "runnerpool,profile", "-n", RUNNERS_NS, "jobpod-nowhere", "--wait=false")
