"""The ``helmhive-session-compactions`` ValidatingAdmissionPolicy: only the owning runner records a compaction.

A SessionBinding's ``status.compactions`` and ``status.lastCompaction`` are its compaction
history: the operator writes one ``SessionCompacted`` AuditRecord per count, from the figures
in ``lastCompaction`` (``docs/sessions.md#compaction``). The runner that owns the binding (its
``spec.runner``) writes them after it compacted the session. This policy refuses any other
write that changes either field -- another ServiceAccount's, another runner pod's, and a
cluster admin's (``system:masters``) alike -- so the history and its audit trail hold only
compactions the runner really made. The owner is told apart by the pod name the API server binds
into the caller's token (``authentication.kubernetes.io/pod-name``), as in the
``helmhive-runner-execution`` policy. The operator only reads them, so it is not excepted either.
Writes that leave both fields as they were (a reset, the runner's turn counts) pass. Pure.
"""

from __future__ import annotations

from typing import Any

from helmhive.api.kinds import GROUP
from helmhive.deploy.admission import build_admission_policy, resource_rule

__all__ = ["COMPACTIONS_POLICY_NAME", "build_session_compactions_policy"]

COMPACTIONS_POLICY_NAME = "helmhive-session-compactions"
RUNNER_USERNAME = "^system:serviceaccount:[^:]+:helmhive-runner-[^:]+$"
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"


def build_session_compactions_policy() -> list[dict[str, Any]]:
    """The policy and its cluster-wide Deny binding."""
    pod = f"request.userInfo.extra['{POD_NAME_EXTRA}']"
    return build_admission_policy(
        COMPACTIONS_POLICY_NAME,
        resource_rules=[resource_rule(GROUP, ["UPDATE"], ["sessionbindings/status"])],
        variables=[
            {
                "name": "changed",
                "expression": (
                    "object.?status.?compactions.orValue(0) != oldObject.?status.?compactions.orValue(0) || "
                    "object.?status.?lastCompaction != oldObject.?status.?lastCompaction"
                ),
            },
            {
                "name": "podName",
                "expression": (
                    f"request.userInfo.username.matches('{RUNNER_USERNAME}') && "
                    f"'{POD_NAME_EXTRA}' in request.userInfo.extra && size({pod}) > 0 ? {pod}[0] : ''"
                ),
            },
            {
                "name": "owner",
                "expression": "variables.podName != '' && oldObject.spec.runner == variables.podName",
            },
        ],
        validations=[
            {
                "expression": "!variables.changed || variables.owner",
                "messageExpression": (
                    "'the compaction history of session binding ' + request.name + ' (status.compactions, "
                    "status.lastCompaction) is written only by its runner ' + oldObject.spec.runner + "
                    "': ' + request.userInfo.username + ' may not change it'"
                ),
                "reason": "Forbidden",
            }
        ],
    )
