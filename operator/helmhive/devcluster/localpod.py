"""Runs one runner pod's container as a local process, the way a kubelet would start it.

The local control plane has no kubelet, so a RunnerPool's StatefulSet makes Pod objects that
stay Pending. For the demo (and by hand), ``helmhive dev run-pod`` starts the pod's container
command on this machine with what the kubelet would give it:

* every volume materialised under ``<state>/pods/<namespace>/<pod>/``: ConfigMap and Secret
  items as files (Secrets mode 0600), emptyDirs and PVCs as empty directories;
* the environment, with ``fieldRef`` values read from the Pod and every path under a mount
  rewritten to its local directory;
* a ServiceAccount token bound to the Pod (TokenRequest), so the API server sees exactly the
  identity the real pod would have, and a kubeconfig for it;
* its own ``/metrics`` port: a pod has a network of its own, local processes share one, so
  ``HELMHIVE_METRICS_PORT`` becomes a free loopback port (``LocalPod.metrics_port``).

The image is not used: the container's ``helmhive`` command runs from this installation.

This module is its own door to the Kubernetes API (the import-linter contract in
``pyproject.toml`` names it): it plays the kubelet of a development cluster -- reads the Pod,
its ConfigMaps and Secrets, mints a bound token -- as the cluster admin, a role no program
that ships in an install has, so none of the product's doors offers those calls.
"""

from __future__ import annotations

import base64
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes import client, config

from helmhive.api.manifest_yaml import ManifestDumper
from helmhive.devcluster.procs import ProcessRecord, free_ports, is_alive, read_record, spawn, terminate

__all__ = ["LocalPodError", "build_local_env", "run_pod", "stop_pod"]

_ANNOTATION_REF = re.compile(r"^metadata\.annotations\['([^']+)'\]$")
_METRICS_PORT_ENV = "HELMHIVE_METRICS_PORT"
_METRICS_PORT_FILE = "metrics-port"


class LocalPodError(RuntimeError):
    """The pod cannot be run locally; the message says why."""


@dataclass(frozen=True, kw_only=True)
class LocalPod:
    name: str
    namespace: str
    root: Path
    record: ProcessRecord
    reused: bool
    metrics_port: int | None = None
    """The loopback port of the pod's ``/metrics``, if its container serves one."""


def _read_metrics_port(root: Path) -> int | None:
    try:
        return int((root / _METRICS_PORT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _field(pod: dict[str, Any], path: str) -> str:
    meta = pod["metadata"]
    if path == "metadata.name":
        return str(meta["name"])
    if path == "metadata.namespace":
        return str(meta["namespace"])
    if path == "status.podIP":  # the pod runs as a process of this machine: its address is loopback
        return "127.0.0.1"
    match = _ANNOTATION_REF.match(path)
    if match:
        return str((meta.get("annotations") or {}).get(match.group(1), ""))
    raise LocalPodError(f"unsupported fieldRef {path!r}")


def build_local_env(pod: dict[str, Any], container: dict[str, Any], mounts: dict[str, Path]) -> dict[str, str]:
    """The container's environment for a local run: fieldRefs resolved, mount paths rewritten."""
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        if "value" in item:
            value = str(item["value"])
        elif "fieldRef" in (item.get("valueFrom") or {}):
            value = _field(pod, item["valueFrom"]["fieldRef"]["fieldPath"])
        else:
            raise LocalPodError(f"unsupported env source for {item['name']}")
        for mount_path, local in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
            if value == mount_path or value.startswith(mount_path.rstrip("/") + "/"):
                value = str(local) + value[len(mount_path.rstrip("/")) :]
                break
        env[item["name"]] = value
    return env


def _materialise(core: client.CoreV1Api, pod: dict[str, Any], root: Path) -> dict[str, Path]:
    namespace = pod["metadata"]["namespace"]
    local: dict[str, Path] = {}
    for volume in pod["spec"].get("volumes") or []:
        directory = root / "volumes" / volume["name"]
        directory.mkdir(parents=True, exist_ok=True)
        if "configMap" in volume:
            data = core.read_namespaced_config_map(volume["configMap"]["name"], namespace).data or {}
            for key, value in data.items():
                (directory / key).write_text(value, encoding="utf-8")
        elif "secret" in volume:
            secret = core.read_namespaced_secret(volume["secret"]["secretName"], namespace)
            items = volume["secret"].get("items") or [{"key": k, "path": k} for k in (secret.data or {})]
            for item in items:
                path = directory / item["path"]
                path.write_bytes(base64.b64decode((secret.data or {})[item["key"]]))
                path.chmod(0o600)
        local[volume["name"]] = directory
    container = pod["spec"]["containers"][0]
    return {m["mountPath"]: local[m["name"]] for m in container.get("volumeMounts") or []}


def _kubeconfig(core: client.CoreV1Api, pod: dict[str, Any], admin_kubeconfig: Path, dest: Path) -> Path:
    meta = pod["metadata"]
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(
            audiences=[],
            expiration_seconds=24 * 3600,
            bound_object_ref=client.V1BoundObjectReference(
                api_version="v1", kind="Pod", name=meta["name"], uid=meta["uid"]
            ),
        )
    )
    response = core.create_namespaced_service_account_token(
        pod["spec"]["serviceAccountName"], meta["namespace"], request
    )
    if response.status is None:
        raise LocalPodError(f"the API server returned no token for pod {meta['name']}")
    token = response.status.token
    admin = yaml.safe_load(admin_kubeconfig.read_text(encoding="utf-8"))
    context = next(c["context"] for c in admin["contexts"] if c["name"] == admin["current-context"])
    cluster = dict(next(c["cluster"] for c in admin["clusters"] if c["name"] == context["cluster"]))
    ca = cluster.get("certificate-authority")
    if ca and not Path(ca).is_absolute():
        cluster["certificate-authority"] = str((admin_kubeconfig.parent / ca).resolve())
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": cluster}],
        "users": [{"name": meta["name"], "user": {"token": token}}],
        "contexts": [
            {"name": "pod", "context": {"cluster": "local", "user": meta["name"], "namespace": meta["namespace"]}}
        ],
        "current-context": "pod",
    }
    dest.write_text(yaml.dump(doc, sort_keys=False, Dumper=ManifestDumper), encoding="utf-8")
    dest.chmod(0o600)
    return dest


def _process_name(namespace: str, name: str) -> str:
    return f"pod-{namespace}-{name}"


def run_pod(
    *, name: str, namespace: str, admin_kubeconfig: Path, state_dir: Path, tie_to_parent: bool = False
) -> LocalPod:
    """Start the pod's container locally (or return the one already running)."""
    pid_dir = state_dir / "pids"
    root = state_dir / "pods" / namespace / name
    record = read_record(pid_dir, _process_name(namespace, name))
    if record is not None and is_alive(record.pid, record.start_ticks):
        return LocalPod(
            name=name, namespace=namespace, root=root, record=record, reused=True, metrics_port=_read_metrics_port(root)
        )
    api = config.new_client_from_config(config_file=str(admin_kubeconfig))  # type: ignore[no-untyped-call]
    core = client.CoreV1Api(api)
    pod = cast(dict[str, Any], api.sanitize_for_serialization(core.read_namespaced_pod(name, namespace)))
    container = pod["spec"]["containers"][0]
    command = list(container.get("command") or []) + list(container.get("args") or [])
    if command[:1] != ["helmhive"]:
        raise LocalPodError(
            f"pod {namespace}/{name} does not run helmhive ({command[:1]}); only runner pods run locally"
        )
    root.mkdir(parents=True, exist_ok=True)
    mounts = _materialise(core, pod, root)
    env = build_local_env(pod, container, mounts)
    metrics_port: int | None = None
    (root / _METRICS_PORT_FILE).unlink(missing_ok=True)
    if env.get(_METRICS_PORT_ENV, "0") != "0":
        (metrics_port,) = free_ports(1)
        env[_METRICS_PORT_ENV], env["HELMHIVE_METRICS_ADDR"] = str(metrics_port), "127.0.0.1"
        (root / _METRICS_PORT_FILE).write_text(str(metrics_port), encoding="utf-8")
    env["KUBECONFIG"] = str(_kubeconfig(core, pod, admin_kubeconfig, root / "kubeconfig"))
    env["PATH"] = os.environ.get("PATH", "")
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    argv = ["env", "-i", *(f"{k}={v}" for k, v in sorted(env.items())), sys.executable, "-m", *command]
    record = spawn(
        _process_name(namespace, name),
        argv,
        log_path=root / "container.log",
        pid_dir=pid_dir,
        tie_to_parent=tie_to_parent,
    )
    return LocalPod(name=name, namespace=namespace, root=root, record=record, reused=False, metrics_port=metrics_port)


def stop_pod(*, name: str, namespace: str, state_dir: Path) -> bool:
    """Stop a pod started by :func:`run_pod` (SIGTERM, as a kubelet would)."""
    record = read_record(state_dir / "pids", _process_name(namespace, name))
    return terminate(record, grace=60) if record is not None else False
