"""Which ending reasons are final and which may run again: reason sets several kinds' decisions share. Pure data.

Kept below the decisions that own them (:mod:`helmhive.policy.agentjob.retry` and
:mod:`helmhive.policy.change.decision` re-export them), so that kstatus's view of each kind
(:mod:`helmhive.policy.kstatus`, which an AgentJob's every write uses) and the Argo CD health
checks (``charts/helmhive/argocd``, whose tables a unit test compares with these) read the very
same sets.
"""

from __future__ import annotations

from helmhive.api.reasons import Reason

__all__ = ["NOT_RERUN", "RETRYABLE_REASONS", "TERMINAL_REASONS"]

RETRYABLE_REASONS = frozenset(
    {Reason.RUNNER_LOST, Reason.JOB_POD_LOST, Reason.INTERRUPTED, Reason.AGENT_CRASHED, Reason.AGENT_UNRESPONSIVE}
)
"""An AgentJob's failures of the infrastructure, not of the job: the only ones worth running again."""

NOT_RERUN = "; not re-run: "
"""What separates an ended job's message from the operator's verdict; its presence means "decided"."""

TERMINAL_REASONS = frozenset(
    {
        Reason.REVIEW_APPROVED,
        Reason.CHANGES_REQUESTED,
        Reason.CHECKS_FAILED,
        Reason.PLANNING_FAILED,
        Reason.IMPLEMENTATION_FAILED,
        Reason.REVIEW_FAILED,
        Reason.JOB_MISSING,
        Reason.INVALID_SPEC,
    }
)
"""A Change's ``Ready`` reasons after which it never acts again."""
