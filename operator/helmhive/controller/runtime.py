"""What every handler needs, injected once: the API wrapper, the clock and the settings.

Handlers take these from a :class:`Runtime` rather than from globals, so tests build one
against the real test cluster with a clock they control.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field

from helmhive.controller.kube import Kube

__all__ = ["Clock", "OperatorConfig", "Runtime", "utc_now"]

Clock = Callable[[], dt.datetime]


def utc_now() -> dt.datetime:
    """The real clock: an aware UTC datetime."""
    return dt.datetime.now(dt.UTC)


@dataclass(frozen=True, kw_only=True)
class OperatorConfig:
    """Operator settings, from flags or environment."""

    namespace: str = "helmhive-system"
    service_account: str = "helmhive-operator"
    liveness_port: int = 8080
    audit_max_age_days: int = 90
    audit_max_records: int = 10000
    # Runner pools: a Lease older than its duration plus this grace means Offline.
    runner_grace_seconds: float = 2.0
    # How often each pool's loop re-derives its runners (and notices stale Leases).
    runner_tick_seconds: float = 1.0
    # How often each pool re-reads its credential Secret, and re-applies its objects to undo drift.
    credential_check_seconds: float = 5.0
    objects_resync_seconds: float = 60.0
    revision_history_limit: int = 10
    webhook_addr: str = "0.0.0.0"
    webhook_port: int = 9443
    webhook_host: str = "127.0.0.1"
    webhooks_enabled: bool = True

    @property
    def username(self) -> str:
        """The operator's own user name as the API server reports it."""
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"


@dataclass(kw_only=True)
class Runtime:
    kube: Kube
    clock: Clock = utc_now
    config: OperatorConfig = field(default_factory=OperatorConfig)
