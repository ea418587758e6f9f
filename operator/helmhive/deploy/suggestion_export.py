"""The ``helmhive-suggestion-export`` ValidatingAdmissionPolicy and the ``helmhive-suggestion-exporter`` role.

``helmhive suggestions export`` creates a SuggestionExport before it writes any file, and the
operator audits it as ``SuggestionsExported`` in the name in ``spec.exportedBy``. This policy makes
that name the API server's word, not the client's: ``exportedBy`` must be the requester's own
username (the pattern of the ``helmhive-change-approval`` policy's ``approvedPlan.by``), and the
requester must be allowed to read the job it names. A SuggestionExport's spec is immutable (a CEL
rule in its CRD), so the name cannot be changed afterwards. Pure.
"""

from __future__ import annotations

from typing import Any

from helmhive.api.kinds import GROUP
from helmhive.deploy.admission import LABELS, build_admission_policy, resource_rule

__all__ = ["EXPORTER_ROLE", "SUGGESTION_EXPORT_POLICY_NAME", "build_suggestion_export_policy"]

SUGGESTION_EXPORT_POLICY_NAME = "helmhive-suggestion-export"
EXPORTER_ROLE = "helmhive-suggestion-exporter"


def build_suggestion_export_policy() -> list[dict[str, Any]]:
    """The policy, its Deny binding, and the ClusterRole to bind to the people who export suggestions."""
    may_read_job = (
        "authorizer.group('helmhive.dev').resource('agentjobs').namespace(object.metadata.namespace)"
        ".name(object.spec.job).check('get').allowed()"
    )
    policy, binding = build_admission_policy(
        SUGGESTION_EXPORT_POLICY_NAME,
        resource_rules=[resource_rule(GROUP, ["CREATE"], ["suggestionexports"])],
        validations=[
            {
                "expression": "object.spec.exportedBy == request.userInfo.username",
                "messageExpression": (
                    "'spec.exportedBy must be your own username (' + request.userInfo.username + "
                    "'): a suggestion export is audited in the name of whoever made it'"
                ),
                "reason": "Forbidden",
            },
            {
                "expression": may_read_job,
                "messageExpression": (
                    "request.userInfo.username + ' may not export the suggestions of agentjob ' + "
                    "object.spec.job + ': exporting needs get on that AgentJob'"
                ),
                "reason": "Forbidden",
            },
        ],
    )
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": EXPORTER_ROLE, "labels": dict(LABELS)},
        "rules": [
            {"apiGroups": [GROUP], "resources": ["agentjobs", "workspaces"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [GROUP], "resources": ["suggestionexports"], "verbs": ["get", "list", "watch", "create"]},
            # An output over 16 KiB is kept in the job's <job>-artifacts ConfigMap, read from there.
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]},
        ],
    }
    return [policy, binding, role]
