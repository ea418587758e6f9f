"""The operator as the chart runs it on real nodes: its image, its identity, its Lease, its webhook."""

from __future__ import annotations

import json

from e2e_rig import SYSTEM_NS, Rig

from harness.wait import wait_for

SELECTOR = "app.kubernetes.io/name=helmhive,app.kubernetes.io/component=operator"


def _operator_pods(rig: Rig) -> list[dict]:
    return [
        p
        for p in rig.get("pods", "-n", SYSTEM_NS, "-l", SELECTOR)["items"]
        if not p["metadata"].get("deletionTimestamp")
    ]


def _holder(rig: Rig) -> str:
    lease = rig.get("lease", "-n", SYSTEM_NS, "helmhive-operator")
    return str(lease["spec"].get("holderIdentity") or "")


def test_the_operator_runs_from_its_image_read_only_as_non_root(rig: Rig) -> None:
    pods = wait_for(lambda: (p := _operator_pods(rig)) and len(p) == 2 and p, timeout=120, describe="two operator pods")
    for pod in pods:
        assert pod["status"]["phase"] == "Running"
        (container,) = pod["spec"]["containers"]
        assert container["image"] == rig.env.images.operator
        (status,) = pod["status"]["containerStatuses"]
        assert status["ready"] is True
        assert status["imageID"], "the kubelet reports the image it ran"
        assert pod["spec"]["nodeName"] in rig.env.nodes
        # What the container really gets, from inside it: uid/gid 65532 and a read-only root.
        probe = (
            "import os, json\n"
            "try:\n    open('/probe', 'w'); ro = False\nexcept OSError as e:\n    ro = e.errno == 30\n"
            "print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), 'ro': ro}))\n"
        )
        seen = json.loads(rig.exec_python(SYSTEM_NS, pod["metadata"]["name"], probe))
        assert seen == {"uid": 65532, "gid": 65532, "ro": True}, seen


def test_two_replicas_elect_one_leader_and_killing_it_hands_over(rig: Rig) -> None:
    pods = {p["metadata"]["name"] for p in _operator_pods(rig)}
    holder = wait_for(
        lambda: _holder(rig) if _holder(rig).split("_")[0] in pods else None, timeout=120, describe="a leader"
    )
    leader = holder.split("_")[0]
    logs = rig.kubectl("logs", "-n", SYSTEM_NS, leader)
    assert "leads; starting the operator" in logs
    follower = (pods - {leader}).pop()
    assert "leads; starting the operator" not in rig.kubectl("logs", "-n", SYSTEM_NS, follower)
    rig.kubectl("delete", "pod", "-n", SYSTEM_NS, leader, "--wait=false")
    new = wait_for(
        lambda: (h := _holder(rig)) and h.split("_")[0] != leader and h,
        timeout=180,
        describe="the Lease to pass from the killed leader",
    )
    assert new.split("_")[0] in {follower} | {p["metadata"]["name"] for p in _operator_pods(rig)}
    wait_for(
        lambda: "leads; starting the operator" in rig.kubectl("logs", "-n", SYSTEM_NS, new.split("_")[0]),
        timeout=60,
        describe="the new leader to start the operator",
    )
    wait_for(lambda: len(_operator_pods(rig)) == 2, timeout=180, describe="the Deployment to replace the killed pod")


def _profile(name: str, **spec: object) -> dict:
    body = {
        "envelope": "change-review",
        "purpose": "Review small diffs.",
        "instructions": "Look for bugs.",
        "providerMappings": [{"provider": "anthropic", "model": "claude-sonnet-4-5"}],
        **spec,
    }
    return {"apiVersion": "helmhive.dev/v1alpha1", "kind": "Profile", "metadata": {"name": name}, "spec": body}


def test_the_profile_webhook_is_reached_through_its_service_by_the_api_server(rig: Rig) -> None:
    rig.kubectl("create", "namespace", "webhook-e2e")
    config = rig.get("validatingwebhookconfiguration", "helmhive.dev")
    assert {w["clientConfig"]["service"]["name"] for w in config["webhooks"]} == {"helmhive-webhook"}
    # The chart's self-managed certificate path: the CA the operator wrote is the bundle the API server trusts.
    secret_names = {s["metadata"]["name"] for s in rig.get("secrets", "-n", SYSTEM_NS)["items"]}
    assert any("webhook" in n for n in secret_names), secret_names
    assert all(w["clientConfig"].get("caBundle") for w in config["webhooks"])
    wide = _profile("too-wide", filesystem="write", tools=["read", "edit"])

    def refused() -> str:
        proc = rig.kubectl_proc("create", "-n", "webhook-e2e", "-f", "-", stdin=json.dumps(wide))
        assert proc.returncode != 0, "the widening profile was admitted"
        assert "spec.filesystem: FilesystemWiderThanEnvelope" in proc.stderr, proc.stderr
        return proc.stderr

    stderr = wait_for(refused, timeout=120, describe="the webhook to refuse a widening Profile")
    assert 'admission webhook "profile-narrowing.helmhive.dev" denied the request' in stderr
    assert "Traceback" not in stderr
    rig.kubectl("create", "-n", "webhook-e2e", "-f", "-", stdin=json.dumps(_profile("narrow")))
    # The call came from the API server on the control-plane node into an operator pod: the
    # operator's access log names the caller as kube-apiserver-admission.
    logs = "".join(rig.kubectl("logs", "-n", SYSTEM_NS, p["metadata"]["name"]) for p in _operator_pods(rig))
    assert '"POST /profile-narrowing' in logs and "kube-apiserver-admission" in logs
    rig.kubectl("delete", "namespace", "webhook-e2e", "--wait=false")
