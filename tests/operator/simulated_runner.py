"""A runner's API writes, exactly as the contract in ``docs/runners.md`` specifies, for cluster tests.

This is not a mock: it talks to the real API server with a runner pod's own ServiceAccount
token (bound to that pod), so RBAC and the runner identity admission policy see exactly
what a real runner would send. It only leaves out the agent: the report is what a test says.

* registration: GET the Runner, CREATE it (``spec.poolRef``) if absent, then write the report;
* the report: server-side apply of ``status.report`` on ``runners/status``, field manager
  ``helmhive-runner``, forced;
* the heartbeat: a ``coordination.k8s.io/v1`` Lease named after the runner, label
  ``helmhive.dev/runner``, annotated with the digest of the last report written (as the runner
  does), renewed by server-side apply (a background thread, on demand).
"""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from harness.identity import Identity
from helmhive.api.runner import REPORT_DIGEST_ANNOTATION, RunnerReport, build_report_digest

__all__ = ["GROUP", "VERSION", "SimulatedRunner", "micro_time"]

GROUP, VERSION = "helmhive.dev", "v1alpha1"
APPLY = "application/apply-patch+yaml"
MANAGER = "helmhive-runner"


def micro_time(when: dt.datetime | None = None) -> str:
    """A Kubernetes MicroTime (RFC 3339 with microseconds)."""
    return (when or dt.datetime.now(dt.UTC)).astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class SimulatedRunner:
    """One runner pod's writes, as that pod."""

    def __init__(self, *, identity: Identity, namespace: str, pool: str, name: str, lease_seconds: int = 5) -> None:
        self.namespace = namespace
        self.pool = pool
        self.name = name
        self.lease_seconds = lease_seconds
        api = identity.api_client()
        self.custom = client.CustomObjectsApi(api)
        self.coordination = client.CoordinationV1Api(api)
        self.core = client.CoreV1Api(api)
        self.registered_at = micro_time()
        self.renewals = 0
        self.last_renewal: dt.datetime | None = None
        self.digest: str | None = None
        """What the next renewal annotates: the digest of the last report written."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # Registration and report ------------------------------------------------------------
    def register(self, **report: Any) -> dict[str, Any]:
        try:
            self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, "runners", self.name)
        except ApiException as err:
            if err.status != 404:
                raise
            body = {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "Runner",
                "metadata": {"name": self.name},
                "spec": {"poolRef": {"name": self.pool}},
            }
            self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, "runners", body)
        return self.report(**report)

    def build_report(
        self,
        *,
        auth: str = "Authenticated",
        auth_reason: str = "SessionCreated",
        generation: int = 1,
        provider: str = "anthropic",
        models: tuple[str, ...] = ("claude-sonnet-4-5",),
        verified_at: dt.datetime | None = None,
        efforts: tuple[str, ...] = ("low", "medium", "high"),
        agent_capabilities: tuple[str, ...] = ("session-load", "session-fork"),
    ) -> dict[str, Any]:
        return {
            "provider": provider,
            "adapter": {"type": "acp", "name": "helmhive-reference-agent", "version": "0.1.0"},
            "authentication": {"state": auth, "reason": auth_reason, "verifiedAt": micro_time(verified_at)},
            "placementLabels": {"domain": "code"},
            "capabilities": ["structured-output"],
            "concurrency": 1,
            "activeJobs": 0,
            "environmentFingerprint": "sha256:" + "0" * 64,
            "agentCapabilities": list(agent_capabilities),
            "catalogue": {"models": [{"id": m, "efforts": list(efforts)} for m in models], "default": models[0]},
            "credentialGeneration": generation,
            "podName": self.name,
            "reportedAt": micro_time(),
            "registeredAt": self.registered_at,
        }

    def report(self, **report: Any) -> dict[str, Any]:
        return self.apply_status({"report": self.build_report(**report)})

    def apply_status(self, status: dict[str, Any], *, name: str | None = None) -> dict[str, Any]:
        """Server-side apply ``status`` onto runner ``name`` (default: this runner) as this pod.

        A report of its own is then, as the runner does, put on its Lease as a digest: at once
        if it already has a Lease, else with the first renewal.
        """
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Runner",
            "metadata": {"name": name or self.name},
            "status": status,
        }
        result: dict[str, Any] = self.custom.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            self.namespace,
            "runners",
            name or self.name,
            body,
            field_manager=MANAGER,
            force=True,
            _content_type=APPLY,
        )
        if name in (None, self.name) and "report" in status:
            try:
                self.digest = build_report_digest(RunnerReport.model_validate(status["report"]))
            except ValidationError:
                return result  # a report the operator cannot parse either; the Lease keeps what it had
            if self.last_renewal is not None:
                self.renew()
        return result

    # Heartbeat ----------------------------------------------------------------------------
    def renew(self, *, name: str | None = None, at: dt.datetime | None = None) -> None:
        """Create or renew the Lease ``name`` (default: this runner's) by server-side apply.

        ``at``: the renewTime to write instead of now (a runner that died long ago)."""
        lease_name = name or self.name
        now = at or dt.datetime.now(dt.UTC)
        metadata: dict[str, Any] = {"name": lease_name, "labels": {"helmhive.dev/runner": lease_name}}
        if self.digest is not None:
            metadata["annotations"] = {REPORT_DIGEST_ANNOTATION: self.digest}
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": lease_name,
                "leaseDurationSeconds": self.lease_seconds,
                "renewTime": micro_time(now),
            },
        }
        self.coordination.patch_namespaced_lease(
            lease_name, self.namespace, body, field_manager=MANAGER, force=True, _content_type=APPLY
        )
        self.renewals += 1
        self.last_renewal = now

    def start_heartbeat(self, interval: float = 1.0) -> None:
        self.renew()
        self._stop.clear()

        def loop() -> None:
            while not self._stop.wait(interval):
                try:
                    self.renew()
                except ApiException:
                    continue

        self._thread = threading.Thread(target=loop, name=f"heartbeat-{self.name}", daemon=True)
        self._thread.start()

    def stop_heartbeat(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def release(self) -> None:
        """Delete the Lease, as a runner does on SIGTERM."""
        self.stop_heartbeat()
        try:
            self.coordination.delete_namespaced_lease(self.name, self.namespace)
        except ApiException as err:
            if err.status != 404:
                raise
