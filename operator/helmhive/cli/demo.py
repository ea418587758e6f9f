"""``helmhive demo``: bring up the local cluster with the operator, apply the examples, show them."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from helmhive.deploy.manifests import OperatorIdentity
from helmhive.devcluster import cluster
from helmhive.devcluster.build import BuildError, ensure_binaries
from helmhive.devcluster.demo import DemoError, Kubectl, ensure_installed, ensure_operator, example_documents
from helmhive.devcluster.demo import stop_operator as stop_demo_operator
from helmhive.devcluster.demo_git import ensure_demo_repository, ensure_git_daemon, stop_git_daemon
from helmhive.devcluster.demo_manifests import (
    DEMO_CHANGE,
    DEMO_JOB,
    DEMO_POOL,
    DEMO_REVIEW_POOL,
    build_change_documents,
    build_demo_documents,
)
from helmhive.devcluster.flags import default_state_dir
from helmhive.devcluster.kind import cluster as kind_cluster
from helmhive.devcluster.kind.demo import KindDemoError, run_kind_demo
from helmhive.devcluster.kind.engine import EngineError
from helmhive.devcluster.localpod import LocalPodError, run_pod, stop_pod
from helmhive.devcluster.progress import step


def _say(text: str) -> None:
    typer.secho(f"==> {text}", fg=typer.colors.CYAN, err=True)


def _helmhive(*args: str, kubeconfig: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "helmhive", *args, "--kubeconfig", str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return proc.stdout + (proc.stderr if proc.returncode else "")


def _governed_change(kubectl: Kubectl, state: Path, namespace: str, kubeconfig: Path) -> None:
    """Plan, approve, implement, check and review a change of the demo's own git repository."""
    _say("governed change: making a small git repository and serving it with git daemon on 127.0.0.1")
    bare, commit = ensure_demo_repository(state)
    url = ensure_git_daemon(state, bare)
    typer.echo(f"{url} at commit {commit}", err=True)
    docs = build_change_documents(repository=url, commit=commit)
    typer.echo(kubectl.apply([d for d in docs if d["kind"] != "Change"], namespace=namespace), err=True)
    pod = f"{DEMO_REVIEW_POOL}-0"
    kubectl.wait_for(f"pod/{pod}", "create", namespace=namespace)
    _say(f"running pod {pod} (a second provider name, so the review can go elsewhere)")
    run_pod(name=pod, namespace=namespace, admin_kubeconfig=kubeconfig, state_dir=state)
    kubectl.wait_for(f"runner/{pod}", "create", namespace=namespace)
    kubectl.wait_for(f"runner/{pod}", "condition=Schedulable", namespace=namespace, timeout=90)
    # A Change's source is immutable, and a re-run serves a new repository: start the change afresh.
    _say(f"removing Change {DEMO_CHANGE} of an earlier demo run, if any (its jobs first)")
    kubectl.run(
        "delete",
        "change",
        DEMO_CHANGE,
        "-n",
        namespace,
        "--ignore-not-found",
        "--cascade=foreground",
        "--wait=true",
        timeout=180,
    )
    _say(f"applying Change {DEMO_CHANGE}: plan, automatic approval, implementation, checks, review")
    typer.echo(kubectl.apply([d for d in docs if d["kind"] == "Change"], namespace=namespace), err=True)
    last = ""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        ready = kubectl.run(
            "get",
            "change",
            DEMO_CHANGE,
            "-n",
            namespace,
            "-o",
            'jsonpath={range .status.conditions[?(@.type=="Ready")]}{.status} {.reason}: {.message}{end}',
            check=False,
        ).strip()
        if ready and ready != last:
            typer.echo(f"   {DEMO_CHANGE}: Ready={ready}", err=True)
            last = ready
        if ready.startswith("True") or (ready.startswith("False") and ready.split()[1].rstrip(":") in _FINAL):
            return
        time.sleep(1)
    raise DemoError(f"change {DEMO_CHANGE} did not finish within 300 s (last: {last})")


_FINAL = frozenset(
    {"ChangesRequested", "ChecksFailed", "PlanningFailed", "ImplementationFailed", "ReviewFailed", "JobMissing"}
)


def run(
    namespace: Annotated[str, typer.Option(help="Namespace for the example workspace.")] = "helmhive-demo",
    state_dir: Annotated[
        Path | None, typer.Option(envvar="HELMHIVE_STATE_DIR", help="Local cluster state directory.")
    ] = None,
    stop: Annotated[bool, typer.Option("--stop", help="Stop the demo's operator and cluster, then exit.")] = False,
    kind: Annotated[
        bool, typer.Option("--kind", help="Run on a kind cluster with real pods (needs Docker; built offline).")
    ] = False,
) -> None:
    """Run Helmhive end to end on a local control plane (or, with --kind, on kind) with the embedded examples."""
    if kind:
        _run_on_kind(namespace, stop=stop)
        return
    state = state_dir or default_state_dir()
    if stop:
        for pool in (DEMO_POOL, DEMO_REVIEW_POOL):
            stop_pod(name=f"{pool}-0", namespace=namespace, state_dir=state)
        stop_git_daemon(state)
        stopped = stop_demo_operator(state)
        names = cluster.stop(state)
        typer.echo(f"stopped operator: {stopped}; stopped components: {', '.join(names) or 'none'}")
        return
    state.mkdir(parents=True, exist_ok=True)
    try:
        _say("building or reusing etcd, kube-apiserver, kube-controller-manager and kubectl")
        what = f"etcd and the Kubernetes binaries (cold: Go builds of several minutes; log {state / 'build.log'})"
        with (state / "build.log").open("a", encoding="utf-8") as log, step(sys.stderr, what):
            binaries = ensure_binaries(log=log)
        _say(f"starting the local control plane in {state}")
        info = cluster.start(binaries, state)
        kubectl = Kubectl(binary=binaries.kubectl, kubeconfig=info.kubeconfig)
        identity = OperatorIdentity()
        _say("installing CRDs, RBAC and the envelope admission policy")
        ensure_installed(kubectl, identity)
        _say("starting the operator as its own ServiceAccount")
        pid, reused = ensure_operator(kubectl, identity, state)
        typer.echo(f"operator pid {pid} ({'already running' if reused else 'started'})", err=True)
        _say(f"applying the examples into namespace {namespace}")
        kubectl.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}])
        typer.echo(kubectl.apply([doc for _, doc in example_documents()], namespace=namespace), err=True)
        _say("adding a reference runner pool (helmhive-reference-agent: deterministic, not a model)")
        demo_docs = build_demo_documents()
        setup = [d for d in demo_docs if d["kind"] != "AgentJob"]
        typer.echo(kubectl.apply(setup, namespace=namespace), err=True)
        pod = f"{DEMO_POOL}-0"
        kubectl.wait_for(f"pod/{pod}", "create", namespace=namespace)
        _say(f"running pod {pod} locally, as a kubelet would (the local cluster has none)")
        local = run_pod(name=pod, namespace=namespace, admin_kubeconfig=info.kubeconfig, state_dir=state)
        typer.echo(f"{pod}: pid {local.record.pid}; log {local.root / 'container.log'}", err=True)
        kubectl.wait_for(f"runner/{pod}", "create", namespace=namespace)
        kubectl.wait_for(f"runner/{pod}", "condition=Schedulable", namespace=namespace, timeout=90)
        _say(f"submitting job {DEMO_JOB} and waiting for it to finish")
        typer.echo(kubectl.apply([d for d in demo_docs if d["kind"] == "AgentJob"], namespace=namespace), err=True)
        kubectl.wait_for(f"agentjob/{DEMO_JOB}", "condition=Succeeded", namespace=namespace, timeout=180)
        _governed_change(kubectl, state, namespace, info.kubeconfig)
    except (BuildError, cluster.ClusterError, DemoError, LocalPodError, OSError) as err:
        typer.secho(f"demo failed: {err}", fg=typer.colors.RED, err=True)
        raise typer.Exit(1) from None
    _show(kubectl, namespace, state, info.kubeconfig)


def _run_on_kind(namespace: str, *, stop: bool) -> None:
    try:
        if stop:
            deleted = kind_cluster.delete_cluster(log=sys.stderr)
            typer.echo(f"kind cluster {kind_cluster.DEFAULT_NAME}: {'deleted' if deleted else 'there was none'}")
            return
        demo = run_kind_demo(namespace, sys.stderr)
    except (BuildError, EngineError, kind_cluster.KindError, KindDemoError, OSError) as err:
        typer.secho(f"demo failed: {err}", fg=typer.colors.RED, err=True)
        raise typer.Exit(1) from None
    kubectl = Kubectl(binary=demo.cluster.kubectl, kubeconfig=demo.cluster.kubeconfig)
    _say("the pods the kubelet runs")
    typer.echo(kubectl.run("get", "pods", "-o", "wide", "-n", namespace))
    typer.echo(kubectl.run("get", "pods", "-o", "wide", "-n", "helmhive-system"))
    _show(kubectl, namespace, None, demo.cluster.kubeconfig)


def _show(kubectl: Kubectl, namespace: str, state: Path | None, kubeconfig: Path) -> None:
    """What the demo made: envelopes, the workspace's objects, the answers, the change and its patch."""
    _say("kubectl get envelopes")
    typer.echo(kubectl.run("get", "envelopes"))
    _say(f"kubectl get helmhive -n {namespace}")
    typer.echo(kubectl.run("get", "helmhive", "-n", namespace))
    _say(f"what {DEMO_JOB} answered, and why check-anthropic-login did not run")
    typer.echo(kubectl.run("get", "agentjob", DEMO_JOB, "-n", namespace, "-o", "jsonpath={.status.result.summary}"))
    typer.echo(
        kubectl.run(
            "get",
            "agentjob",
            "check-anthropic-login",
            "-n",
            namespace,
            "-o",
            'jsonpath={range .status.conditions[?(@.type=="Routed")]}{.reason}: {.message}{end}',
        )
    )
    _say(f"kubectl helmhive change status {DEMO_CHANGE} -n {namespace}")
    typer.echo(_helmhive("change", "status", DEMO_CHANGE, "-n", namespace, kubeconfig=kubeconfig))
    _say(f"kubectl helmhive change patch {DEMO_CHANGE} -n {namespace} | head -n 25")
    patch = _helmhive("change", "patch", DEMO_CHANGE, "-n", namespace, kubeconfig=kubeconfig)
    typer.echo("\n".join(patch.splitlines()[:25]))
    _say("try it yourself")
    env = "helmhive dev kind env" if state is None else f"helmhive dev cluster env --state-dir {state}"
    typer.echo(f'eval "$({env})"\nkubectl get helmhive -n {namespace}')
    typer.echo(f"helmhive console -n {namespace}   # the web console on 127.0.0.1 (docs/console.md)")
