"""``helmhive demo --kind``: the same demo as on the local control plane, on kind with real pods.

1. build or reuse everything and create (or reuse) the two-node kind cluster (:mod:`.cluster`);
2. ``docker build`` Helmhive's images and ``kind load`` them;
3. ``helm upgrade --install`` the chart with those images;
4. apply the examples, the reference pool and its job into a namespace under Pod Security
   ``restricted``, all at once (the examples' own pools name registry images no node here can pull,
   so they are applied with ``replicas: 0``: a pod waiting for its image still holds its CPU request);
   the kubelet starts the reference runner pod, which registers and runs the job; the reference
   pools run in ``execution.mode: JobPod`` with one warm pod each (:func:`.demo_objects.in_job_pods`),
   so every job, the governed change's included, runs in a pod of its own;
5. a git server pod, the egress the docs tell an administrator to add for it, and a governed change:
   plan, automatic approval, implementation, checks, review on the second pool.

Each step says what it does; the caller shows the result with the same commands as the local demo.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from typing import Any, TextIO

import yaml

from helmhive.devcluster.demo import example_documents
from helmhive.devcluster.demo_manifests import DEMO_CHANGE, DEMO_JOB, build_change_documents, build_demo_documents
from helmhive.devcluster.helm import ensure_helm
from helmhive.devcluster.kind.cluster import KindCluster, ensure_cluster, load_helmhive
from helmhive.devcluster.kind.demo_objects import (
    build_git_egress,
    build_git_server,
    git_url,
    in_job_pods,
    with_runner_image,
    without_runners,
)
from helmhive.devcluster.kind.images import REPO_ROOT
from helmhive.devcluster.progress import step

__all__ = ["KindDemo", "KindDemoError", "run_kind_demo"]

SYSTEM_NS = "helmhive-system"
GIT_NS = "helmhive-demo-git"


class KindDemoError(RuntimeError):
    """A step of the kind demo failed; the message says which and why."""


@dataclass(frozen=True, kw_only=True)
class KindDemo:
    cluster: KindCluster
    namespace: str


def _kubectl(cluster: KindCluster, *args: str, stdin: str | None = None, timeout: float = 600) -> str:
    proc = subprocess.run(
        [str(cluster.kubectl), "--kubeconfig", str(cluster.kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise KindDemoError(f"kubectl {' '.join(args[:4])} failed: {proc.stderr.strip()[-2000:]}")
    return proc.stdout


def _apply(cluster: KindCluster, docs: list[dict[str, Any]], namespace: str) -> str:
    text = "---\n".join(yaml.safe_dump(d, sort_keys=False) for d in docs)
    return _kubectl(cluster, "apply", "-n", namespace, "-f", "-", stdin=text)


def _wait_ready(cluster: KindCluster, kind: str, name: str, namespace: str, log: TextIO, *, timeout: float) -> None:
    """Wait for the Ready condition to be True, saying each new state; fail on a final False."""
    last = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = _kubectl(
            cluster, "get", kind, name, "-n", namespace, "-o",
            'jsonpath={range .status.conditions[?(@.type=="Ready")]}{.status} {.reason}: {.message}{end}',
        ).strip()  # fmt: skip
        if state and state != last:
            log.write(f"   {kind}/{name}: Ready={state}\n")
            log.flush()
            last = state
        if state.startswith("True"):
            return
        time.sleep(1)
    raise KindDemoError(f"{kind}/{name} did not become Ready within {timeout:.0f} s (last: {last or 'no condition'})")


def run_kind_demo(namespace: str, log: TextIO) -> KindDemo:
    """Run the demo on kind; return the cluster and namespace for showing the results."""
    cluster = ensure_cluster(log=log)
    images = load_helmhive(cluster, log=log)
    helm = ensure_helm(log=log)
    operator_repo, operator_tag = images.operator.rsplit(":", 1)
    with step(log, "helm upgrade --install helmhive charts/helmhive (two operator replicas, local images)"):
        proc = subprocess.run(
            [
                str(helm), "upgrade", "--install", "helmhive", str(REPO_ROOT / "charts" / "helmhive"),
                "-n", SYSTEM_NS, "--create-namespace", "--kubeconfig", str(cluster.kubeconfig),
                "--set", f"operator.image.repository={operator_repo}", "--set", f"operator.image.tag={operator_tag}",
                "--set", "operator.image.pullPolicy=Never", "--set", "operator.replicas=2",
                "--wait", "--timeout", "5m",
            ],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
    if proc.returncode != 0:
        raise KindDemoError(f"helm install failed: {proc.stderr.strip()[-2000:]}")
    namespace_doc = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": namespace,
            "labels": {"pod-security.kubernetes.io/enforce": "restricted", "helmhive.dev/workspaces": "enabled"},
        },
    }
    _kubectl(cluster, "apply", "-f", "-", stdin=yaml.safe_dump(namespace_doc))
    log.write(f"==> applying the examples, the reference pool and job {DEMO_JOB} into {namespace}, all at once\n")
    log.write("   (the examples' pools name registry images no node here can pull: applied with replicas 0,\n")
    log.write("    since a pod waiting for its image still holds the CPU the demo's job pods need)\n")
    log.write("   (the reference pools run each job in a pod of its own, execution.mode JobPod, one warm pod each)\n")
    reference = in_job_pods(with_runner_image(build_demo_documents(), images.runner))
    docs = without_runners([doc for _, doc in example_documents()]) + reference
    log.write(_apply(cluster, docs, namespace))
    with step(log, f"waiting for the kubelet to start the runner pod and for job {DEMO_JOB} to finish"):
        _kubectl(
            cluster, "wait", "-n", namespace, "--for=condition=Succeeded", f"agentjob/{DEMO_JOB}", "--timeout=600s"
        )
    log.write("==> a git server pod with the demo repository, and runner egress to it\n")
    _kubectl(
        cluster,
        "apply",
        "-f",
        "-",
        stdin=yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": GIT_NS}}),
    )
    _apply(cluster, build_git_server(images.runner), GIT_NS)
    _apply(cluster, [build_git_egress(GIT_NS)], namespace)
    _kubectl(cluster, "wait", "-n", GIT_NS, "--for=condition=Ready", "pod/git", "--timeout=300s")
    commit = next(
        line.split()[1]
        for line in _kubectl(cluster, "logs", "-n", GIT_NS, "git").splitlines()
        if line.startswith("serving ")
    )
    docs = in_job_pods(
        with_runner_image(build_change_documents(repository=git_url(GIT_NS), commit=commit), images.runner)
    )
    existing = _kubectl(cluster, "get", "change", "-n", namespace, "-o", "name")
    if f"change.helmhive.dev/{DEMO_CHANGE}" in existing:
        log.write(f"==> removing Change {DEMO_CHANGE} of an earlier run (its source is immutable)\n")
        _kubectl(cluster, "delete", "change", DEMO_CHANGE, "-n", namespace, "--wait=true")
    log.write(f"==> applying Change {DEMO_CHANGE}: plan, automatic approval, implementation, checks, review\n")
    log.write(_apply(cluster, docs, namespace))
    _wait_ready(cluster, "change", DEMO_CHANGE, namespace, log, timeout=900)
    return KindDemo(cluster=cluster, namespace=namespace)
