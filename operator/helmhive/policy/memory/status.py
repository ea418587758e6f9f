"""A memory record's ``Active`` condition with its Workspace considered, waiting for one that is late. Pure.

:func:`helmhive.policy.memory.selection.decide_memory_active` decides from the record alone (in effect
until ``expiresAt``); :func:`~helmhive.policy.memory.selection.decide_memory_scope` checks a service
scope against the Workspace. :func:`decide_memory_status` puts both together with the
Workspace's existence: a Workspace that does not exist yet is waited for
(``WaitingForWorkspace``) until the record's deadline, then ``WorkspaceNotFound`` (see
:mod:`helmhive.policy.waiting`). Unlike a job, a record is never final: the operator decides
it again whenever its Workspace appears, changes or goes away.

No I/O; ``now`` and the record's creation time are arguments.
"""

from __future__ import annotations

import datetime as dt

from helmhive.api.memory import MemoryRecordSpec, WorkspaceSpec
from helmhive.api.reasons import Reason
from helmhive.policy.memory.selection import MemoryActivity, decide_memory_active, decide_memory_scope
from helmhive.policy.waiting import decide_reference_wait, missing_workspace

__all__ = ["decide_memory_status"]


def _utc(moment: dt.datetime) -> dt.datetime:
    return moment.replace(tzinfo=dt.UTC) if moment.tzinfo is None else moment


def decide_memory_status(
    *,
    record: MemoryRecordSpec,
    namespace: str,
    workspace: WorkspaceSpec | None,
    workspace_exists: bool,
    created_at: dt.datetime | None,
    now: dt.datetime,
    wait_limit: dt.timedelta,
) -> MemoryActivity:
    """Return a record's ``Active`` condition, its Workspace considered, and when to look again.

    In order: expired (``Expired``, final); the Workspace does not exist (``WaitingForWorkspace``
    until ``created_at + wait_limit``, then ``WorkspaceNotFound``); it exists but its spec is
    unreadable (``workspace`` None: ``WorkspaceNotFound``); the scope names no service of it
    (``ServiceNotInWorkspace``); else ``InEffect``. ``next_transition`` is the earliest of the
    expiry and the end of the wait. A Workspace that appears (or changes) is the caller's cue
    to decide again; it is not a transition in time.
    """
    activity = decide_memory_active(record=record, now=now)
    if not activity.active:
        return activity
    expiry = activity.next_transition
    if not workspace_exists:
        wait = decide_reference_wait(
            missing=missing_workspace(namespace=namespace, name=record.workspace),
            created_at=created_at,
            now=now,
            limit=wait_limit,
        )
        candidates = [t for t in (expiry, wait.deadline if wait.waiting else None) if t is not None]
        return MemoryActivity(
            active=False,
            reason=wait.reason,
            message=wait.message,
            next_transition=min(candidates, key=_utc) if candidates else None,
        )
    if workspace is None:
        return MemoryActivity(
            active=False,
            reason=Reason.WORKSPACE_NOT_FOUND,
            message=f"workspace {record.workspace} has an invalid spec",
            next_transition=expiry,
        )
    violations = decide_memory_scope(record=record, workspace=workspace)
    if violations:
        return MemoryActivity(
            active=False, reason=violations[0].reason, message=violations[0].message, next_transition=expiry
        )
    return activity
