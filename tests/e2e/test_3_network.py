"""The pool's generated NetworkPolicy, enforced by kube-router on real nodes.

Every refusal here has a control: the same target is reached from a pod that no policy selects,
so a refusal is the policy's doing and not a dead target. With no enforcer in the cluster, the
refusals would be connections, and these tests fail.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from e2e_rig import RUNNERS_NS, Rig

from harness.wait import wait_for
from helmhive.devcluster.demo_manifests import DEMO_POOL

OTHER_NS = "elsewhere-e2e"
# A web server on 8080, and on 6443: a port the pool's policy allows, but only outside the pod networks.
_SERVE_8080_AND_6443 = (
    "import functools, http.server, threading\n"
    "handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory='/')\n"
    "for port in (8080, 6443):\n"
    "    server = http.server.ThreadingHTTPServer(('', port), handler)\n"
    "    threading.Thread(target=server.serve_forever, daemon=True).start()\n"
    "threading.Event().wait()\n"
)
RUNNER_POD = f"{DEMO_POOL}-0"


def _pod(name: str, image: str, command: list[str], *, node: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"operator": "Exists"}],
            "automountServiceAccountToken": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": command,
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
        },
    }


@contextlib.contextmanager
def _listener(host: str, port: int) -> Iterator[int]:
    """A TCP listener on this host (outside the cluster) that accepts and closes connections."""
    server = socket.create_server((host, port), reuse_port=False)
    server.settimeout(0.5)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                conn, _ = server.accept()
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        stop.set()
        thread.join()
        server.close()


def _gateway(network: str = "kind") -> str:
    out = subprocess.run(
        ["docker", "network", "inspect", network, "-f", "{{range .IPAM.Config}}{{.Gateway}} {{end}}"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return next(ip for ip in out.split() if "." in ip)


@pytest.fixture(scope="module")
def targets(runners: Rig) -> dict[str, str]:
    """A web server pod on the control-plane node behind a Service, and a free probe pod on the worker."""
    rig = runners
    cp = next(n for n in rig.env.nodes if n.endswith("control-plane"))
    worker = next(n for n in rig.env.nodes if not n.endswith("control-plane"))
    rig.kubectl("create", "namespace", OTHER_NS)
    image = rig.env.images.runner
    server = _pod("target", image, ["python3", "-c", _SERVE_8080_AND_6443], node=cp, labels={"app": "target"})
    probe = _pod(
        "free-probe", image, ["python3", "-c", "import time; time.sleep(10**9)"], node=worker, labels={"app": "probe"}
    )
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "target"},
        "spec": {"selector": {"app": "target"}, "ports": [{"port": 8080, "targetPort": 8080}]},
    }
    rig.apply([server, probe, service], OTHER_NS)
    rig.kubectl("wait", "-n", OTHER_NS, "--for=condition=Ready", "pod/target", "pod/free-probe", "--timeout=180s")
    rig.kubectl("wait", "-n", RUNNERS_NS, "--for=condition=Ready", f"pod/{RUNNER_POD}", "--timeout=300s")
    target_ip = rig.get("pod", "-n", OTHER_NS, "target")["status"]["podIP"]
    runner_ip = rig.get("pod", "-n", RUNNERS_NS, RUNNER_POD)["status"]["podIP"]
    return {"target_ip": target_ip, "runner_ip": runner_ip, "service": f"target.{OTHER_NS}.svc.cluster.local"}


def test_the_pools_policy_is_the_one_enforced(runners: Rig) -> None:
    policy = runners.get("networkpolicy", "-n", RUNNERS_NS, f"helmhive-runner-{DEMO_POOL}")
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert policy["spec"]["podSelector"]["matchLabels"]["helmhive.dev/pool"] == DEMO_POOL
    # The chart's runnerNetworkPolicy.clusterCIDRs (the nodes' pod CIDRs) reached the policy.
    pod_cidrs = {n["spec"]["podCIDR"] for n in runners.get("nodes")["items"]}
    https = next(rule for rule in policy["spec"]["egress"] if {"protocol": "TCP", "port": 443} in rule["ports"])
    assert https["to"] == [{"ipBlock": {"cidr": "0.0.0.0/0", "except": sorted(pod_cidrs)}}], https
    router = runners.get("daemonset", "-n", "kube-system", "kube-router")
    assert router["status"]["numberReady"] == len(runners.env.nodes)


def test_a_runner_pod_reaches_the_api_server_and_https_and_nothing_else(runners: Rig, targets: dict[str, str]) -> None:
    rig = runners
    gateway = _gateway()
    with _listener(gateway, 443), _listener(gateway, 8443):
        # Controls: a pod no policy selects reaches every target, across nodes too.
        for host, port in ((targets["service"], 8080), (targets["target_ip"], 8080), (gateway, 8443), (gateway, 443)):
            assert rig.probe(OTHER_NS, "free-probe", host, port) == "open", (host, port)
        # The runner pod: the API server and an outside HTTPS address are allowed …
        assert rig.probe(RUNNERS_NS, RUNNER_POD, "kubernetes.default.svc", 443) == "open"
        assert rig.probe(RUNNERS_NS, RUNNER_POD, gateway, 443) == "open"
        # … another pod, another namespace's Service and an outside address on another port are
        # not; nor is a pod on an allowed port, since the pod networks are excepted (clusterCIDRs).
        assert rig.probe(OTHER_NS, "free-probe", targets["target_ip"], 6443) == "open"
        for host, port in (
            (targets["target_ip"], 8080),
            (targets["service"], 8080),
            (gateway, 8443),
            (targets["target_ip"], 6443),
        ):
            seen = rig.probe(RUNNERS_NS, RUNNER_POD, host, port)
            assert seen.startswith("closed"), f"runner pod reached {host}:{port}: {seen}"


def test_a_pod_outside_the_pool_cannot_reach_the_runners_ports(runners: Rig, targets: dict[str, str]) -> None:
    rig = runners
    # The runner serves its metrics on 9090 (seen from inside the pod) …
    inside = rig.probe(RUNNERS_NS, RUNNER_POD, "127.0.0.1", 9090)
    assert inside == "open"
    # … and no pod outside the pool gets there.
    seen = rig.probe(OTHER_NS, "free-probe", targets["runner_ip"], 9090)
    assert seen.startswith("closed"), seen


def test_without_the_policy_the_same_connection_succeeds(runners: Rig, targets: dict[str, str]) -> None:
    """The refusal above is the policy's: without it the same connection is made; with it back, refused."""
    rig = runners
    name = f"helmhive-runner-{DEMO_POOL}"
    policy = rig.get("networkpolicy", "-n", RUNNERS_NS, name)
    for field in ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields"):
        policy["metadata"].pop(field, None)
    rig.kubectl("delete", "networkpolicy", "-n", RUNNERS_NS, name)
    try:
        wait_for(
            lambda: rig.probe(OTHER_NS, "free-probe", targets["runner_ip"], 9090) == "open",
            timeout=120,
            describe="the runner's port to open once no policy selects the pod",
        )
    finally:
        rig.kubectl("apply", "-f", "-", stdin=json.dumps(policy))
    wait_for(
        lambda: rig.probe(OTHER_NS, "free-probe", targets["runner_ip"], 9090).startswith("closed"),
        timeout=120,
        describe="kube-router to enforce the policy again",
    )
