"""`helmhive sessions list|reset` against a real API server: resets are audited, ids never printed.

The operator, not the CLI, writes the ``SessionReset`` record, in the name of the administrator
who ran the command (see ``tests/operator/test_session_reset_audit.py`` for kubectl and deletion).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from typing import Any

from kubernetes import client
from runner_pod import runner_pod_api
from session_witness import witnesses_ready

from harness.cluster import ClusterHandle
from harness.kube import IdentityFactory, Kube
from harness.operator import OperatorProcess
from harness.wait import wait_for

NAME_SB = "sb-0123456789abcdef0123"
GROUP, VERSION = "helmhive.dev", "v1alpha1"
CANARY = "native-session-CANARY-93f1"


def _cli(cluster: ClusterHandle, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "helmhive", "sessions", *args, "--kubeconfig", str(cluster.kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_reset_forgets_the_stored_session_and_is_audited(
    operator: OperatorProcess,
    cluster: ClusterHandle,
    kube: Kube,
    namespace: str,
    crds: list[str],
    service_account_identity: IdentityFactory,
) -> None:
    binding: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SessionBinding",
        "metadata": {"name": "sb-0123456789abcdef0123"},
        "spec": {
            "workspace": "payments",
            "profile": "quick-review",
            "provider": "anthropic",
            "runner": "pool-a-0",
            "credentialGeneration": 1,
            "scope": "workspace",
        },
    }
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "sessionbindings", binding)
    # Written as its runner would: only the binding's runner may record a compaction.
    runner = runner_pod_api(kube, namespace, service_account_identity)
    wait_for(lambda: runner.get_namespaced_custom_object(GROUP, VERSION, namespace, "sessionbindings", NAME_SB))
    runner.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        namespace,
        "sessionbindings",
        "sb-0123456789abcdef0123",
        {
            "status": {
                "stored": True,
                "turns": 2,
                "compactions": 1,
                "secretName": "helmhive-sessions-pool-a-0",
                "secretKey": "sb-0123456789abcdef0123",
            }
        },
    )
    kube.core.create_namespaced_secret(
        namespace,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name="helmhive-sessions-pool-a-0"),
            data={"sb-0123456789abcdef0123": base64.b64encode(CANARY.encode()).decode(), "other": "eA=="},
        ),
    )
    listed = _cli(cluster, "list", "-n", namespace, "-o", "json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert rows[0]["name"] == "sb-0123456789abcdef0123" and rows[0]["stored"] is True
    assert rows[0]["compactions"] == 1
    assert CANARY not in listed.stdout + listed.stderr

    witnesses_ready(kube)  # so the operator sees who made the reset
    done = _cli(cluster, "reset", "sb-0123456789abcdef0123", "-n", namespace)
    assert done.returncode == 0, done.stderr
    assert "next job on it starts a fresh session" in done.stdout
    assert CANARY not in done.stdout + done.stderr

    secret = kube.core.read_namespaced_secret("helmhive-sessions-pool-a-0", namespace)
    assert set(secret.data) == {"other"}
    status = kube.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "sessionbindings", "sb-0123456789abcdef0123"
    )["status"]
    assert status["stored"] is False and status["resets"] == 1

    def session_resets() -> list[dict[str, Any]]:
        audits = kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "auditrecords")["items"]
        return [a for a in audits if a["spec"]["action"] == "SessionReset"]

    reset = wait_for(session_resets, timeout=60, describe="the operator's SessionReset record")
    assert len(reset) == 1
    assert "system:masters" in reset[0]["spec"]["actor"]["groups"]
    audits = kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "auditrecords")["items"]
    assert CANARY not in json.dumps(audits)

    missing = _cli(cluster, "reset", "sb-does-not-exist", "-n", namespace)
    assert missing.returncode == 1
    assert "404" in missing.stderr and "Traceback" not in missing.stderr
