"""Whether this operator can read the API server now, and since when: the clock of the heartbeat hold.

A runner's Lease looks stale to an operator that could not read it; the derivation must not
call such a runner Offline (``docs/runners.md``, :class:`helmhive.policy.runners.state.HeartbeatHold`).
:class:`ApiContact` keeps, on an injected monotonic clock, whether the operator is in contact with
the API server and when it last regained contact (its own start counts as one).
:func:`run_contact_probe` feeds it: every ``interval_s`` one consistent read that etcd must serve
(a LIST of at most one runner Lease, never from the watch cache), with a short timeout. Contact
is lost once reads have failed for ``lost_after_s`` (a single reset connection is not a gap); a
read still unanswered after ``lost_after_s`` counts as failed while it waits.

Contact *returns* when the runner-Lease watch delivers its first event after a read succeeded
again (:meth:`ApiContact.watched`, called by the Lease event handler): only then can the
operator see renewals, and Kopf may resume a watch seconds after the server is back. If no Lease
event comes within ``watch_wait_s`` of the read (every runner is dead, or the watch is stuck),
contact counts as returned at that bound, so a dead runner is not held forever. Listeners
registered with :meth:`ApiContact.on_return` are called at the return (the pool loops derive
every runner again). Plain state on Kopf's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from helmhive.controller.kube.door import Kube
from helmhive.policy.runners.state import decide_heartbeat_hold

__all__ = ["ApiContact", "run_contact_probe"]

log = logging.getLogger("helmhive.controller.kube.contact")

RUNNER_LEASES = "helmhive.dev/runner"
"""The label of runner Leases (the probe reads one)."""


class ApiContact:
    """Contact with the API server, on a monotonic clock (see the module docstring)."""

    def __init__(
        self,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        lost_after_s: float = 2.0,
        watch_wait_s: float = 30.0,
    ) -> None:
        self.monotonic = monotonic
        self.lost_after_s = lost_after_s
        self.watch_wait_s = watch_wait_s
        start = monotonic()
        self.contact = True
        """Reads succeed, and the Lease watch has spoken since (or ``watch_wait_s`` passed)."""
        self.reading = True
        """The last probe read succeeded."""
        self.read_back_at = start
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
        if self.reading and now - self.last_ok >= self.lost_after_s:
            self.reading = False
            if self.contact:
                self.contact = False
                self.losses += 1
                log.warning("lost contact with the API server; runners' stale heartbeats are held, not Offline")

    def succeeded(self) -> None:
        """A read succeeded: contact returns with the Lease watch's next event, or at ``watch_wait_s``."""
        now = self.monotonic()
        self.last_ok = now
        if not self.reading:
            self.reading = True
            self.read_back_at = now
        if not self.contact and now - self.read_back_at >= self.watch_wait_s:
            self._returned(self.read_back_at + self.watch_wait_s, how="no Lease event came")

    def watched(self) -> None:
        """The runner-Lease watch delivered an event: if reads work again, contact is back now."""
        if not self.contact and self.reading:
            self._returned(self.monotonic(), how="the Lease watch is back")

    def _returned(self, at: float, *, how: str) -> None:
        self.contact = True
        self.returned_at = at
        log.warning("contact with the API server is back (%s); stale heartbeats are held for one Lease duration", how)
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


async def run_contact_probe(
    contact: ApiContact, kube: Kube, *, interval_s: float = 1.0, request_timeout: tuple[float, float] = (2.0, 3.0)
) -> None:
    """Probe the API server every ``interval_s`` seconds, forever (cancel to stop); each read is
    bounded by ``request_timeout`` (connect, read).

    At most one probe is in flight, and one that has not answered for ``contact.lost_after_s``
    counts as a failed read while it waits: a read that hangs (the client retries a timed-out
    read a few times, each up to its timeout, which took 12 s once) must not delay the
    loss of contact past a runner's Lease.
    """
    probe: asyncio.Task[None] | None = None
    started = 0.0
    try:
        while True:
            if probe is None:
                probe = asyncio.create_task(
                    kube.probe_contact(label_selector=RUNNER_LEASES, request_timeout=request_timeout), name="api-probe"
                )
                started = contact.monotonic()
            done, _ = await asyncio.wait({probe}, timeout=interval_s)
            if probe in done:
                error = probe.exception()
                probe = None
                if error is None:
                    contact.succeeded()
                else:  # any failure to read is a failure of contact
                    contact.failed()
                await asyncio.sleep(max(0.0, started + interval_s - contact.monotonic()))
            elif contact.monotonic() - started >= contact.lost_after_s:
                contact.failed()  # still unanswered: as good as failed
    finally:
        if probe is not None:
            probe.cancel()
