"""Helpers of the e2e tier: kubectl and helm against the kind cluster, probes from inside pods.

Every check here goes through a real component: kubectl to the kind API server, ``kubectl exec``
into pods started by a kubelet, TCP connections between pods that kube-router routes and polices.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.kind import KindEnv
from helmhive.devcluster.demo_manifests import build_demo_documents
from helmhive.devcluster.kind.demo_objects import with_runner_image

__all__ = ["CANARY", "CHART", "REPO", "RUNNERS_NS", "Rig", "probe_script", "reference_documents"]

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "helmhive"
RELEASE = "helmhive"
SYSTEM_NS = "helmhive-system"
RUNNERS_NS = "runners-e2e"
CANARY = "canary-credential-3f9a1c7e-e2e"
SLOW_ENV = [
    {"name": "HELMHIVE_REFERENCE_AGENT_SLOW_STEPS", "value": "240"},
    {"name": "HELMHIVE_REFERENCE_AGENT_SLOW_INTERVAL", "value": "0.5"},
]


def reference_documents(rig: Rig) -> list[dict[str, Any]]:
    """The demo's reference pool, profile and job, with the runner image built here and a canary credential."""
    docs = with_runner_image(build_demo_documents(), rig.env.images.runner, env=SLOW_ENV)
    for doc in docs:
        if doc["kind"] == "Secret":
            doc["stringData"] = {"token": CANARY}
    return docs


def probe_script(host: str, port: int, *, timeout: float = 4.0) -> str:
    """Python for ``kubectl exec``: try one TCP connection, print ``open`` or ``closed <why>``."""
    return (
        "import socket,sys\n"
        "try:\n"
        f"    socket.create_connection(({host!r}, {port}), timeout={timeout}).close(); print('open')\n"
        "except OSError as e:\n"
        "    print('closed', type(e).__name__)\n"
    )


@dataclass
class Rig:
    """The kind cluster, helm, and the release under test."""

    env: KindEnv
    helm_bin: Path

    def run(self, *cmd: str | Path, stdin: str | None = None, timeout: float = 300, check: bool = True) -> str:
        proc = subprocess.run(
            [str(c) for c in cmd],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env={
                "KUBECONFIG": str(self.env.kubeconfig),
                "PATH": f"{self.env.kubectl.parent}:/usr/bin:/bin",
                "HOME": os.environ.get("HOME", "/tmp"),  # kubectl and helm keep caches under $HOME
            },
        )
        if check:
            assert proc.returncode == 0, (
                f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
            )
        return proc.stdout if check else proc.stdout + proc.stderr

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 300) -> str:
        return self.run(self.env.kubectl, *args, stdin=stdin, check=check, timeout=timeout)

    def kubectl_proc(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.env.kubectl), "--kubeconfig", str(self.env.kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    def helm(self, *args: str | Path, timeout: float = 600) -> str:
        return self.run(self.helm_bin, *args, "--kubeconfig", str(self.env.kubeconfig), timeout=timeout)

    def get(self, *args: str) -> dict[str, Any]:
        return json.loads(self.kubectl("get", "-o", "json", *args))

    def apply(self, docs: list[dict[str, Any]], namespace: str | None = None) -> str:
        text = "---\n".join(yaml.safe_dump(d, sort_keys=False) for d in docs)
        return self.kubectl("apply", *(["-n", namespace] if namespace else []), "-f", "-", stdin=text)

    def exec_python(self, namespace: str, pod: str, code: str, *, container: str | None = None) -> str:
        args = ["exec", "-n", namespace, pod]
        if container:
            args += ["-c", container]
        return self.kubectl(*args, "--", "python3", "-c", code, timeout=60).strip()

    def probe(self, namespace: str, pod: str, host: str, port: int) -> str:
        return self.exec_python(namespace, pod, probe_script(host, port))

    def install_values(self) -> list[str]:
        """Helm flags that point the chart at the images built and loaded here."""
        repo, tag = self.env.images.operator.rsplit(":", 1)
        runner_repo, runner_tag = self.env.images.runner.rsplit(":", 1)
        return [
            "--set", f"operator.image.repository={repo}",
            "--set", f"operator.image.tag={tag}",
            "--set", "operator.image.pullPolicy=Never",
            "--set", f"runner.image.repository={runner_repo}",
            "--set", f"runner.image.tag={runner_tag}",
            "--set", "runner.image.pullPolicy=Never",
        ]  # fmt: skip
