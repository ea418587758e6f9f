"""The objects the demo and the e2e tier add on a kind cluster, where pods are real. Pure.

- :func:`build_git_server`: the demo's repository served by ``git daemon`` from a pod. The pod
  builds the same one-commit repository as ``helmhive demo`` does on loopback
  (:func:`helmhive.devcluster.demo_git.ensure_demo_repository`: fixed author and dates, so the
  same commit id everywhere) with the runner image's git, then serves it on 9418.
- :func:`build_git_egress`: what docs/source.md tells an administrator to add for ``git://``
  sources, since a pool's own NetworkPolicy allows only DNS, 443 and 6443.
- :func:`with_runner_image`: a RunnerPool runs the locally built runner image, never pulled.
- :func:`in_job_pods`: RunnerPools that run each job in a pod of their own, with warm pods, sized for
  kind nodes that share this machine's two cores.
- :func:`without_runners`: the examples' RunnerPools with ``replicas: 0``. They name registry images
  no kind node here can pull, and a pod waiting for its image still holds its CPU request on the
  node, which left the demo's own job pods unschedulable ("Insufficient cpu").
"""

from __future__ import annotations

import copy
from typing import Any

from helmhive.api.egress import provider_egress

__all__ = [
    "GIT_PORT",
    "build_git_egress",
    "build_git_server",
    "git_url",
    "in_job_pods",
    "with_runner_image",
    "without_runners",
]

GIT_PORT = 9418
_SERVE = (
    "import os\n"
    "from pathlib import Path\n"
    "from helmhive.devcluster.demo_git import ensure_demo_repository\n"
    "bare, commit = ensure_demo_repository(Path('/srv'))\n"
    "print('serving', commit, flush=True)\n"
    f"os.execvp('git', ['git', 'daemon', '--reuseaddr', '--port={GIT_PORT}', '--base-path=/srv/demo-git',\n"
    "                  '--export-all', '/srv/demo-git'])\n"
)
_LABELS = {"app.kubernetes.io/name": "helmhive-demo-git"}


def git_url(namespace: str) -> str:
    """The demo repository's URL through the git Service in ``namespace``."""
    return f"git://git.{namespace}.svc.cluster.local/shop.git"


def build_git_server(image: str) -> list[dict[str, Any]]:
    """A Pod (restricted Pod Security) serving the demo repository, and its Service ``git``."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "git", "labels": dict(_LABELS)},
        "spec": {
            "automountServiceAccountToken": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "git",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", _SERVE],
                    "ports": [{"containerPort": GIT_PORT}],
                    "readinessProbe": {"tcpSocket": {"port": GIT_PORT}, "periodSeconds": 2},
                    "volumeMounts": [{"name": "srv", "mountPath": "/srv"}],
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
            "volumes": [{"name": "srv", "emptyDir": {}}],
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "git"},
        "spec": {"selector": dict(_LABELS), "ports": [{"port": GIT_PORT, "targetPort": GIT_PORT}]},
    }
    return [pod, service]


def build_git_egress(git_namespace: str) -> dict[str, Any]:
    """A NetworkPolicy for the runner pods of a namespace: egress to the git server pod on 9418."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "helmhive-runners-to-git"},
        "spec": {
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "helmhive-runner"}},
            "policyTypes": ["Egress"],
            "egress": [
                {
                    "to": [
                        {
                            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": git_namespace}},
                            "podSelector": {"matchLabels": dict(_LABELS)},
                        }
                    ],
                    "ports": [{"protocol": "TCP", "port": GIT_PORT}],
                }
            ],
        },
    }


def with_runner_image(
    docs: list[dict[str, Any]], image: str, *, env: list[dict[str, str]] | None = None
) -> list[dict[str, Any]]:
    """Copies of ``docs`` whose RunnerPools run ``image`` (never pulled), with extra agent env if given."""
    out = copy.deepcopy(docs)
    for doc in out:
        if doc.get("kind") == "RunnerPool":
            doc["spec"]["image"] = image
            doc["spec"]["imagePullPolicy"] = "Never"
            if env and doc["spec"]["adapter"].get("type") == "acp":
                doc["spec"]["adapter"]["acp"]["env"] = list(env)
    return out


JOB_POD_LIMITS = {"cpuMillicores": 250, "memoryBytes": 512 * 1024 * 1024, "diskBytes": 1024 * 1024 * 1024}
"""A job pod's requests (= limits) on kind: the default two cores would not fit beside the rest."""


def in_job_pods(docs: list[dict[str, Any]], *, warm_pods: int = 1) -> list[dict[str, Any]]:
    """Copies of ``docs`` whose RunnerPools are in ``execution.mode: JobPod`` with ``warm_pods`` warm pods
    (and credentialIsolation Proxy, which JobPod needs; the reference provider's default)."""
    out = copy.deepcopy(docs)
    for doc in out:
        if doc.get("kind") == "RunnerPool":
            doc["spec"]["execution"] = {"mode": "JobPod", "warmPods": warm_pods}
            doc["spec"]["credentialIsolation"] = "Proxy"
            if provider_egress(doc["spec"]["provider"]) is None and "egress" not in doc["spec"]:
                # A second reference provider name has no default upstream; the reference agent calls
                # none, so a reserved name (RFC 2606) that is never reached says so.
                doc["spec"]["egress"] = {"upstream": "https://provider.invalid"}
            doc["spec"]["jobLimits"] = {**doc["spec"].get("jobLimits", {}), **JOB_POD_LIMITS}
    return out


def without_runners(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of ``docs`` whose RunnerPools keep every field but run no pods (``replicas: 0``)."""
    out = copy.deepcopy(docs)
    for doc in out:
        if doc.get("kind") == "RunnerPool":
            doc["spec"]["replicas"] = 0
    return out
