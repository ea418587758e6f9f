"""Whether this operator can read the API server now, and since when: the clock of the heartbeat hold.

A runner's Lease looks stale to an operator that could not read it; the derivation must not
call such a runner Offline (``docs/runners.md``, :class:`helmhive.policy.runners.HeartbeatHold`).
:class:`ApiContact` keeps, on an injected monotonic clock, whether the operator is in contact with
the API server and when it last regained contact (its own start counts as one).
:func:`run_contact_probe` feeds it: every ``interval_s`` one consistent read that etcd must serve
(a LIST of at most one runner Lease, never from the watch cache), with a short timeout. Contact
is lost once reads have failed for ``lost_after_s`` (a single reset connection is not a gap), and
returns at the first read that succeeds; listeners registered with :meth:`ApiContact.on_return`
are called then (the pool loops derive every runner again).

The probe stands in for "the watches came back": Kopf offers no hook on a watch's resumption,
and a watch cannot see a gap the API server itself had. Plain state on Kopf's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from helmhive.controller.kube import Kube
from helmhive.policy.runners import decide_heartbeat_hold

__all__ = ["ApiContact", "run_contact_probe"]

log = logging.getLogger("helmhive.controller.contact")

RUNNER_LEASES = "helmhive.dev/runner"
"""The label of runner Leases (the probe reads one)."""


class ApiContact:
    """Contact with the API server, on a monotonic clock (see the module docstring)."""

    def __init__(self, *, monotonic: Callable[[], float] = time.monotonic, lost_after_s: float = 2.0) -> None:
        self.monotonic = monotonic
        self.lost_after_s = lost_after_s
        start = monotonic()
        self.contact = True
        self.returned_at = start
        """When contact last returned; the operator's start counts as a return."""
        self.last_ok = start
        self.losses = 0
        self._listeners: list[Callable[[], None]] = []

    def on_return(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def failed(self) -> None:
        """A read failed: contact is lost once reads have failed for ``lost_after_s``."""
        now = self.monotonic()
        if self.contact and now - self.last_ok >= self.lost_after_s:
            self.contact = False
            self.losses += 1
            log.warning("lost contact with the API server; runners' stale heartbeats are held, not Offline")

    def succeeded(self) -> None:
        """A read succeeded: if contact was lost, it returns now."""
        now = self.monotonic()
        self.last_ok = now
        if not self.contact:
            self.contact = True
            self.returned_at = now
            log.warning("contact with the API server is back; stale heartbeats are held for one Lease duration")
            for listener in self._listeners:
                try:
                    listener()
                except Exception:
                    log.exception("a contact listener failed")

    def hold_left(self, *, lease_duration_s: float, grace_s: float) -> float | None:
        """Seconds the heartbeat hold has left for a Lease of ``lease_duration_s`` (``inf`` without contact)."""
        return decide_heartbeat_hold(
            contact=self.contact,
            returned_at=self.returned_at,
            now=self.monotonic(),
            lease_duration_s=lease_duration_s,
            grace_s=grace_s,
        )


async def run_contact_probe(contact: ApiContact, kube: Kube, *, interval_s: float = 1.0) -> None:
    """Probe the API server every ``interval_s`` seconds, forever (cancel to stop)."""
    while True:
        try:
            await kube.probe_contact(label_selector=RUNNER_LEASES, request_timeout=(2.0, 3.0))
        except asyncio.CancelledError:
            raise
        except Exception:  # any failure to read is a failure of contact
            contact.failed()
        else:
            contact.succeeded()
        await asyncio.sleep(interval_s)
