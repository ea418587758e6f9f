"""Runner pods started by a kubelet: admitted under Pod Security `restricted`, registered over their
own ServiceAccount token, and running a job, all applied at once as GitOps would."""

from __future__ import annotations

import json
from typing import Any

from e2e_rig import CANARY, RUNNERS_NS, SYSTEM_NS, Rig

from harness.wait import wait_for
from helmhive.devcluster.demo_manifests import DEMO_JOB, DEMO_POOL


def _job(rig: Rig, name: str) -> dict[str, Any]:
    return rig.get("agentjob", "-n", RUNNERS_NS, name)


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind), {})


def test_a_runner_pod_registers_over_its_token_and_runs_a_job(runners: Rig) -> None:
    rig = runners
    job = wait_for(
        lambda: (j := _job(rig, DEMO_JOB)) and _condition(j, "Ready").get("reason") == "Completed" and j,
        timeout=300,
        describe=f"job {DEMO_JOB} to complete on a runner pod",
    )
    pod = rig.get("pod", "-n", RUNNERS_NS, f"{DEMO_POOL}-0")
    assert pod["spec"]["containers"][0]["image"] == rig.env.images.runner
    assert pod["spec"]["nodeName"] in rig.env.nodes
    assert pod["status"]["phase"] == "Running"
    # It registered as itself: the Runner is the pod's, Online and schedulable, with a real report.
    runner = rig.get("runner", "-n", RUNNERS_NS, f"{DEMO_POOL}-0")
    assert runner["status"]["report"]["authentication"]["state"] == "Authenticated", runner["status"]["report"]
    assert runner["status"]["report"]["podName"] == f"{DEMO_POOL}-0"
    assert job["status"]["assignment"]["runner"] == f"{DEMO_POOL}-0"
    # The pod's token is the projected ServiceAccount token of the pool's own account.
    assert pod["spec"]["serviceAccountName"] == f"helmhive-runner-{DEMO_POOL}"
    # kubectl logs and exec reach the real container.
    logs = rig.kubectl("logs", "-n", RUNNERS_NS, f"{DEMO_POOL}-0")
    assert "runner starting" in logs
    assert rig.exec_python(RUNNERS_NS, f"{DEMO_POOL}-0", "import os; print(os.getuid())") == "65532"
    # Events from the real pod (kubelet) and from the operator about the job.
    events = rig.get("events", "-n", RUNNERS_NS)["items"]
    reasons = {(e["involvedObject"]["kind"], e["reason"]) for e in events}
    assert ("Pod", "Started") in reasons, reasons
    assert any(kind == "AgentJob" for kind, _ in reasons), reasons
    # No secret anywhere a user can read: status, events, logs.
    everything = json.dumps(job) + json.dumps(runner) + json.dumps(events) + logs
    assert CANARY not in everything


def test_pod_security_restricted_is_enforced_and_our_pods_pass_it(runners: Rig) -> None:
    rig = runners
    ns = rig.get("namespace", RUNNERS_NS)
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    # The runner pod, with every setting the operator gives it, was admitted and runs.
    rig.kubectl("wait", "-n", RUNNERS_NS, "--for=condition=Ready", f"pod/{DEMO_POOL}-0", "--timeout=300s")
    privileged = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "privileged-probe"},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": rig.env.images.runner,
                    "imagePullPolicy": "Never",
                    "securityContext": {"privileged": True},
                }
            ]
        },
    }
    proc = rig.kubectl_proc("create", "-n", RUNNERS_NS, "-f", "-", stdin=json.dumps(privileged))
    assert proc.returncode != 0
    assert 'violates PodSecurity "restricted:latest"' in proc.stderr, proc.stderr


def test_the_operator_metrics_service_is_scraped(rig: Rig) -> None:
    # Through the API server's service proxy: control-plane node -> Service -> operator pod.
    text = rig.kubectl(
        "get", "--raw", f"/api/v1/namespaces/{SYSTEM_NS}/services/http:helmhive-metrics:9090/proxy/metrics"
    )
    assert "# TYPE" in text
    assert "helmhive_" in text


_UNSHARE = (
    "import ctypes, os\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "rc = libc.unshare(0x10000000 | 0x40000000)  # CLONE_NEWUSER | CLONE_NEWNET\n"
    "print('allowed' if rc == 0 else 'refused ' + os.strerror(ctypes.get_errno()))\n"
)


def test_the_runner_reports_the_sandbox_a_real_node_gives_it(runners: Rig) -> None:
    """Under the RuntimeDefault seccomp profile of a restricted pod, the runner cannot make user or
    network namespaces; its report says so, with the reason, instead of claiming them."""
    rig = runners
    wait_for(lambda: rig.get("runner", "-n", RUNNERS_NS, f"{DEMO_POOL}-0")["status"].get("report"), timeout=300)
    sandbox = rig.get("runner", "-n", RUNNERS_NS, f"{DEMO_POOL}-0")["status"]["report"]["sandbox"]
    inside = rig.exec_python(RUNNERS_NS, f"{DEMO_POOL}-0", _UNSHARE)
    if inside.startswith("refused"):
        assert sandbox["network"] in {"Landlock", "None"}, sandbox
        assert "unshare" in sandbox.get("networkReason", ""), sandbox
    else:
        assert sandbox["network"] == "Namespace", sandbox
    assert sandbox["cgroups"] in {"None", "V1", "V2"}
    if sandbox["cgroups"] == "None":
        assert sandbox.get("cgroupsReason"), sandbox
