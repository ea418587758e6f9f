"""The chaos run's real parts and the means to break them; it decides nothing (see ``chaos.py``).

* :class:`ControlPlane`: the local control plane (``helmhive.devcluster``) in its own state
  directory; :meth:`ControlPlane.restart` stops one component (``etcd`` or ``kube-apiserver``)
  and starts it again with the very argv, ports and data it had (its pid record), then waits
  until it answers ``/readyz``. The devcluster module is not changed for this.
* :class:`CutProxy`: a TCP proxy between the operator and the API server (the operator's
  kubeconfig points at it); :meth:`CutProxy.cut` closes every open connection at once, which
  drops the operator's watches and any request in flight, as a load balancer or network would.
* :class:`Operator`: ``helmhive operator run`` as a subprocess with its own ServiceAccount
  token; :meth:`Operator.kill` is SIGKILL, :meth:`Operator.start` waits for its liveness.
* :class:`RunnerPods`: the RunnerPool's pods started as ``helmhive dev run-pod`` starts them
  (:func:`helmhive.devcluster.localpod.run_pod`: the pod's env, volumes and bound token);
  :meth:`RunnerPods.kill` SIGKILLs a pod's whole process group (the runner and its agent), as a
  node losing the container would.
* :class:`Recorder`: watches of AgentJobs and Runners that keep every stored version in the API
  server's order, resume from the last resourceVersion after a broken connection and re-list
  (counted as a gap) when the server says the version is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
from bench_runners import install, operator_kubeconfig
from chaos_invariants import JobEvent, RunnerEvent, job_event, runner_event
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from helmhive.devcluster import cluster as devcluster
from helmhive.devcluster.build import ensure_binaries
from helmhive.devcluster.flags import StateLayout
from helmhive.devcluster.localpod import LocalPod, run_pod
from helmhive.devcluster.procs import (
    ProcessRecord,
    client_tls,
    free_ports,
    is_alive,
    log_tail,
    probe,
    read_record,
    spawn,
    terminate,
)

__all__ = ["ControlPlane", "CutProxy", "Operator", "Recorder", "RunnerPods", "wait_until"]

GROUP, VERSION = "helmhive.dev", "v1alpha1"


def wait_until(predicate: Callable[[], Any], *, timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll ``predicate`` (an exception counts as "not yet") until it is truthy; raise TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = predicate()
            if value:
                return value
            last = value
        except Exception as err:  # the cluster may be restarting: keep asking
            last = err
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}; last: {last!r}"[:2000])
        time.sleep(interval)


@dataclass
class ControlPlane:
    """etcd, kube-apiserver and kube-controller-manager in ``root`` (see the module docstring)."""

    root: Path
    info: devcluster.ClusterInfo | None = None
    last_stop_seconds: float = 0.0

    @property
    def layout(self) -> StateLayout:
        return StateLayout(self.root)

    def start(self) -> devcluster.ClusterInfo:
        with (self.root.parent / "build.log").open("a") as log:
            binaries = ensure_binaries(log=log)
        self.info = devcluster.start(binaries, self.root, tie_to_parent=True)
        install(self.api())
        return self.info

    def stop(self) -> None:
        devcluster.stop(self.root)

    def api(self) -> client.ApiClient:
        assert self.info is not None
        return config.new_client_from_config(config_file=str(self.info.kubeconfig))

    def ready(self, name: str) -> bool:
        assert self.info is not None
        pki, ports = self.layout.pki, self.info.ports
        if name == "etcd":
            return probe("/readyz", port=ports.etcd_client)[0]
        tls = client_tls(ca_file=pki.ca_cert, cert_file=pki.cert("admin"), key_file=pki.key("admin"))
        return probe("/readyz", port=ports.apiserver, tls=tls)[0]

    def restart(self, name: str, *, down_seconds: float = 0.0, timeout: float = 180.0) -> float:
        """Stop ``name`` (SIGTERM, then SIGKILL), keep it down ``down_seconds``, start it again with the same
        argv; return the seconds until the API server answers ``/readyz`` again."""
        record = read_record(self.layout.pids, name)
        assert record is not None, f"{name} was not started by this control plane"
        started = time.monotonic()
        terminate(record, grace=15)
        self.last_stop_seconds = time.monotonic() - started
        time.sleep(down_seconds)
        fresh = spawn(name, record.argv, log_path=Path(record.log), pid_dir=self.layout.pids, tie_to_parent=True)
        try:
            wait_until(
                lambda: self.ready(name) and self.ready("kube-apiserver"),
                timeout=timeout,
                what=f"{name} ready after its restart",
            )
        except TimeoutError as err:
            raise TimeoutError(f"{err}\n{name} log:\n{log_tail(fresh.log)}") from None
        return time.monotonic() - started


class CutProxy:
    """A loopback TCP proxy whose open connections can all be cut at once (runs its own event loop thread)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = free_ports(1)[0]
        self.cut_connections = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-proxy", daemon=True)
        self._thread.start()
        self._ready.wait(10)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", self.port))
        self._ready.set()
        self._loop.run_forever()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            self._writers -= {writer, up_writer}

    async def _cut(self) -> int:
        writers = list(self._writers)
        for writer in writers:
            with contextlib.suppress(Exception):
                writer.transport.abort()  # a reset, not a polite close
        return len(writers) // 2

    def cut(self) -> int:
        """Reset every connection through the proxy; return how many client connections were cut."""
        cut = asyncio.run_coroutine_threadsafe(self._cut(), self._loop).result(10)
        self.cut_connections += cut
        return cut

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)


@dataclass
class Operator:
    """The real operator process, talking to the API server through ``server`` (the cut proxy).

    Started like a control-plane component (``spawn``: its own session, ended if this process
    dies), from the main thread only: the parent-death signal follows the thread that started it.
    """

    plane: ControlPlane
    workdir: Path
    server: str
    record: ProcessRecord | None = None
    ports: list[int] = field(default_factory=lambda: free_ports(3))
    kubeconfig: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    """Operator settings (``HELMHIVE_...``) on top of this process's environment."""

    @property
    def log_path(self) -> Path:
        return self.workdir / "operator.log"

    def alive(self) -> bool:
        return self.record is not None and is_alive(self.record.pid, self.record.start_ticks)

    def start(self, *, timeout: float = 120.0) -> float:
        """Start it and wait for its liveness; return the seconds that took."""
        assert self.plane.info is not None
        if self.kubeconfig is None:
            proxied = replace(self.plane.info, server=self.server)
            self.kubeconfig = operator_kubeconfig(self.plane.api(), proxied, self.workdir / "operator.kubeconfig")
        health, webhook, metrics = self.ports
        started = time.monotonic()
        argv = [
            "env",
            *(f"{k}={v}" for k, v in sorted(self.env.items())),
            sys.executable,
            "-m",
            "helmhive",
            "operator",
            "run",
            "--kubeconfig",
            str(self.kubeconfig),
            f"--liveness=http://127.0.0.1:{health}/healthz",
            "--webhook-addr=127.0.0.1",
            "--webhook-host=127.0.0.1",
            f"--webhook-port={webhook}",
            "--metrics-addr=127.0.0.1",
            f"--metrics-port={metrics}",
        ]
        self.record = spawn(
            "helmhive-operator", argv, log_path=self.log_path, pid_dir=self.workdir / "pids", tie_to_parent=True
        )
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{health}/healthz"
        while not _quietly(lambda: httpx.get(url, timeout=2).status_code == 200):
            if not self.alive():
                raise RuntimeError(f"the operator exited:\n{log_tail(self.log_path)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the operator was not live in {timeout:g} s:\n{log_tail(self.log_path)}")
            time.sleep(0.2)
        return time.monotonic() - started

    def kill(self) -> None:
        if self.record is not None and self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.record.pid, signal.SIGKILL)
            wait_until(lambda: not self.alive() or _reap(self.record), timeout=30, what="the operator to die")
            _reap(self.record)

    def stop(self) -> None:
        if self.record is not None:
            terminate(self.record, grace=30)


def _reap(record: ProcessRecord | None) -> bool:
    if record is not None:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(record.pid, os.WNOHANG)
    return False


def _quietly(check: Callable[[], bool]) -> bool:
    try:
        return check()
    except (httpx.HTTPError, OSError):
        return False


class RunnerPods:
    """The pool's pods, run locally as ``helmhive dev run-pod`` runs them (the kubelet's part).

    Pods are (re)started by one long-lived thread, as one kubelet would: ``run_pod`` ties each
    pod to its parent with ``PR_SET_PDEATHSIG``, which Linux fires when the *thread* that
    started the child ends, so a pod started from a short-lived timer thread would get SIGTERM
    at once.
    """

    def __init__(self, plane: ControlPlane, namespace: str, names: list[str], state_dir: Path) -> None:
        self.plane, self.namespace, self.names, self.state_dir = plane, namespace, names, state_dir
        self.pods: dict[str, LocalPod] = {}
        self.starts = 0
        self.failures: list[str] = []
        self._due: list[tuple[float, str]] = []
        self._lock = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._kubelet, name="chaos-kubelet", daemon=True)
        self._thread.start()

    def _start(self, name: str) -> None:
        assert self.plane.info is not None
        pod = run_pod(
            name=name,
            namespace=self.namespace,
            admin_kubeconfig=self.plane.info.kubeconfig,
            state_dir=self.state_dir,
            tie_to_parent=True,
        )
        self.pods[name] = pod
        self.starts += 1

    def _kubelet(self) -> None:
        while True:
            with self._lock:
                while not self._closed and not (self._due and self._due[0][0] <= time.monotonic()):
                    self._lock.wait(timeout=0.1)
                if self._closed:
                    return
                _, name = heapq.heappop(self._due)
            deadline = time.monotonic() + 120
            while True:
                try:
                    self._start(name)
                    break
                except Exception as err:  # the API server may be restarting: try again, as a kubelet does
                    if time.monotonic() > deadline:
                        self.failures.append(f"pod {name} not restarted: {err!r}")
                        break
                    time.sleep(0.5)
            with self._lock:
                self._lock.notify_all()

    def start(self, name: str, *, delay: float = 0.0) -> None:
        """Start (or restart) ``name`` after ``delay`` seconds, on the kubelet thread."""
        with self._lock:
            heapq.heappush(self._due, (time.monotonic() + delay, name))
            self._lock.notify_all()

    def settled(self, timeout: float = 180.0) -> None:
        """Wait until every pod due to start has been started."""
        with self._lock:
            self._lock.wait_for(lambda: not self._due and self._thread.is_alive(), timeout=timeout)
        wait_until(lambda: set(self.pods) == set(self.names) or self.failures, timeout=timeout, what="every pod")

    def kill(self, name: str) -> None:
        """SIGKILL the pod's process group: the runner and the agent it started die together."""
        pod = self.pods.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pod.record.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pod.record.pid, 0)

    def stop_all(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        for name in list(self.pods):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pods.pop(name).record.pid, signal.SIGTERM)

    def logs(self) -> dict[str, str]:
        base = self.state_dir / "pods" / self.namespace
        return {f"runner log {p.parent.name}": p.read_text(errors="replace") for p in base.glob("*/container.log")}


class Recorder:
    """Every stored version of the namespace's AgentJobs and Runners, from watches that survive restarts."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.namespace = namespace
        self.jobs: list[JobEvent] = []
        self.runners: list[RunnerEvent] = []
        self.gaps = 0
        self.reconnects = 0
        self.origin = time.monotonic()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._watch, args=("agentjobs",), daemon=True, name="chaos-watch-jobs"),
            threading.Thread(target=self._watch, args=("runners",), daemon=True, name="chaos-watch-runners"),
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=40)

    def _record(self, plural: str, obj: dict[str, Any], *, deleted: bool = False, relisted: bool = False) -> None:
        at = round(time.monotonic() - self.origin, 3)
        if plural == "agentjobs":
            self.jobs.append(job_event(obj, deleted=deleted, relisted=relisted, at=at))
        else:
            self.runners.append(runner_event(obj, relisted=relisted, at=at))

    def _list(self, plural: str, *, relisted: bool) -> str:
        listed = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, plural)
        at = round(time.monotonic() - self.origin, 3)
        # One extend (atomic under the GIL): a check reading the history mid-way never sees half a
        # re-list, which the invariants judge as one snapshot.
        if plural == "agentjobs":
            self.jobs.extend([job_event(i, relisted=relisted, at=at) for i in listed["items"]])
        else:
            self.runners.extend([runner_event(i, relisted=relisted, at=at) for i in listed["items"]])
        return str(listed["metadata"]["resourceVersion"])

    def _watch(self, plural: str) -> None:
        version: str | None = None
        first = True
        while not self._stop.is_set():
            try:
                if version is None:
                    version = self._list(plural, relisted=not first)
                    first = False
                stream = watch.Watch()
                for event in stream.stream(
                    self.custom.list_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    self.namespace,
                    plural,
                    resource_version=version,
                    timeout_seconds=20,
                    allow_watch_bookmarks=True,
                ):
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        raise ApiException(status=int(obj.get("code") or 500), reason=str(obj.get("reason")))
                    version = str(obj["metadata"]["resourceVersion"])
                    if event["type"] != "BOOKMARK":
                        self._record(plural, obj, deleted=event["type"] == "DELETED")
                    if self._stop.is_set():
                        break
            except ApiException as err:
                if err.status == 410:
                    self.gaps += 1
                    version = None
                else:
                    self.reconnects += 1
                time.sleep(0.3)
            except Exception:  # a broken connection while the API server restarts: resume from version
                self.reconnects += 1
                time.sleep(0.3)
