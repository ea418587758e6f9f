"""Pure builders of the manifests that install Helmhive: identity, RBAC and admission policy.

The Helm chart in ``charts/helmhive`` renders the same objects (a test compares them), and
the test harness and ``helmhive dev`` apply these directly. Nothing here does I/O.
"""

from __future__ import annotations

from typing import Any

from helmhive.api.kinds import GROUP
from helmhive.deploy.admission import LABELS as _LABELS
from helmhive.deploy.admission import build_admission_policy, resource_rule
from helmhive.deploy.runner_execution import build_runner_execution_policy
from helmhive.deploy.session_compactions import build_session_compactions_policy
from helmhive.deploy.suggestion_export import build_suggestion_export_policy
from helmhive.policy.runners.pool import RUNNER_NAME_PREFIX

__all__ = [
    "OperatorIdentity",
    "build_audit_trail_policy",
    "build_envelope_policy",
    "build_install_manifests",
    "build_operator_rbac",
    "build_qualification_policy",
    "build_runner_identity_policy",
]

ENVELOPE_POLICY_NAME = "helmhive-envelopes-read-only"
RUNNER_POLICY_NAME = "helmhive-runner-identity"
CHANGE_APPROVAL_POLICY_NAME = "helmhive-change-approval"
CHANGE_APPROVER_ROLE = "helmhive-change-approver"
AUDIT_POLICY_NAME = "helmhive-audit-trail"


class OperatorIdentity:
    """The operator's namespace and ServiceAccount, and the username the API server gives it."""

    __slots__ = ("namespace", "service_account")

    def __init__(self, *, namespace: str = "helmhive-system", service_account: str = "helmhive-operator") -> None:
        self.namespace = namespace
        self.service_account = service_account

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"


def _rule(groups: list[str], resources: list[str], verbs: list[str]) -> dict[str, Any]:
    return {"apiGroups": groups, "resources": resources, "verbs": verbs}


_ALL = ["get", "list", "watch", "create", "update", "patch", "delete"]
_READ = ["get", "list", "watch"]


def build_operator_rbac(identity: OperatorIdentity) -> list[dict[str, Any]]:
    """ServiceAccount, ClusterRole and ClusterRoleBinding for the operator.

    The role holds what it hands to runners (``runners/status``, Leases), because RBAC
    lets a subject grant only permissions it has itself.
    """
    name = identity.service_account
    rules = [
        _rule([GROUP], ["*"], _ALL),
        _rule([GROUP], ["*/status"], ["get", "update", "patch"]),
        _rule(["apiextensions.k8s.io"], ["customresourcedefinitions"], _READ),
        _rule([""], ["namespaces"], _READ),
        _rule([""], ["events"], ["create", "patch", "update"]),
        _rule(["events.k8s.io"], ["events"], ["create", "patch", "update"]),
        _rule([""], ["secrets", "configmaps", "serviceaccounts", "services"], _ALL),
        # Warm job pods; and what runners of JobPod pools get (JOB_POD_ROLE_RULES).
        _rule([""], ["pods"], [*_READ, "create", "patch", "delete"]),
        _rule(["apps"], ["statefulsets", "controllerrevisions"], _ALL),
        _rule(["policy"], ["poddisruptionbudgets"], _ALL),
        _rule(["networking.k8s.io"], ["networkpolicies"], _ALL),
        _rule(["rbac.authorization.k8s.io"], ["roles", "rolebindings"], _ALL),
        _rule(["coordination.k8s.io"], ["leases"], _ALL),
        # Kopf keeps the helmhive.dev webhook configurations pointed at the operator's certificate.
        _rule(
            ["admissionregistration.k8s.io"],
            ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"],
            [*_READ, "create", "patch", "update"],
        ),
    ]
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": identity.namespace, "labels": dict(_LABELS)},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name, "labels": dict(_LABELS)},
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name, "labels": dict(_LABELS)},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": identity.namespace}],
        },
    ]


def build_envelope_policy(identity: OperatorIdentity) -> list[dict[str, Any]]:
    """A ValidatingAdmissionPolicy (and binding) that lets only the operator write Envelopes."""
    username = identity.username
    return build_admission_policy(
        ENVELOPE_POLICY_NAME,
        resource_rules=[resource_rule(GROUP, ["CREATE", "UPDATE", "DELETE"], ["envelopes", "envelopes/status"])],
        validations=[
            {
                "expression": f"request.userInfo.username == '{username}'",
                "messageExpression": (
                    "'envelopes are read-only: the Helmhive operator publishes them from code, so "
                    "' + request.userInfo.username + ' may not ' + request.operation.lowerAscii() + "
                    "' envelope ' + request.name"
                ),
                "reason": "Forbidden",
            }
        ],
    )


QUALIFICATION_POLICY_NAME = "helmhive-qualification-jobs"


def _mark(obj: str, field: str, key: str) -> str:
    """CEL: the value of ``obj.metadata.<field>[key]``, or '' when absent."""
    return f"(has({obj}.metadata.{field}) && '{key}' in {obj}.metadata.{field} ? {obj}.metadata.{field}['{key}'] : '')"


def _marks(obj: str) -> str:
    """CEL: the qualification marks besides the runner label, joined (pool, probe, round)."""
    return " + '|' + ".join(
        (
            _mark(obj, "labels", "helmhive.dev/qualification-pool"),
            _mark(obj, "labels", "helmhive.dev/qualification-probe"),
            _mark(obj, "annotations", "helmhive.dev/qualification-round"),
        )
    )


def build_qualification_policy(identity: OperatorIdentity) -> list[dict[str, Any]]:
    """A ValidatingAdmissionPolicy (and binding): only the operator marks an AgentJob as a qualification probe.

    The label ``helmhive.dev/qualification`` pins a job to one runner and lets it past that runner's
    qualification block (``docs/runners.md#qualification``); the pool and probe labels and the round
    annotation tell the operator which probe it is. Anyone else who creates or updates an AgentJob
    must leave all four as they were (absent on create).
    """
    operator = f"request.userInfo.username == '{identity.username}'"
    return build_admission_policy(
        QUALIFICATION_POLICY_NAME,
        resource_rules=[resource_rule(GROUP, ["CREATE", "UPDATE"], ["agentjobs"])],
        variables=[
            {"name": "label", "expression": _mark("object", "labels", "helmhive.dev/qualification")},
            {
                "name": "oldLabel",
                "expression": "request.operation == 'UPDATE' ? "
                + _mark("oldObject", "labels", "helmhive.dev/qualification")
                + " : ''",
            },
            {"name": "marks", "expression": _marks("object")},
            {"name": "oldMarks", "expression": f"request.operation == 'UPDATE' ? {_marks('oldObject')} : '||'"},
        ],
        validations=[
            {
                "expression": f"{operator} || variables.label == variables.oldLabel",
                "messageExpression": (
                    "'metadata.labels[helmhive.dev/qualification] is set by the Helmhive operator only (it pins a "
                    "qualification probe to its runner): ' + request.userInfo.username + ' may not ' + "
                    "(variables.oldLabel == '' ? 'set' : 'change') + ' it on agentjob ' + request.name"
                ),
                "reason": "Forbidden",
            },
            {
                "expression": f"{operator} || variables.marks == variables.oldMarks",
                "messageExpression": (
                    "'the labels helmhive.dev/qualification-pool and helmhive.dev/qualification-probe and the "
                    "annotation helmhive.dev/qualification-round are set by the Helmhive operator only: ' + "
                    "request.userInfo.username + ' may not set or change them on agentjob ' + request.name"
                ),
                "reason": "Forbidden",
            },
        ],
    )


# The status fields the operator derives; a runner's write must leave each as it was.
_OPERATOR_RUNNER_FIELDS = (
    "conditions",
    "reportedStatus",
    "effectiveControlState",
    "lastHeartbeatTime",
    "registeredAt",
    "models",
    "observedGeneration",
    "qualification",
)


def build_runner_identity_policy() -> list[dict[str, Any]]:
    """A ValidatingAdmissionPolicy (and binding): a runner pod writes only its own Runner and Lease.

    It applies to callers whose username is ``system:serviceaccount:<ns>:helmhive-runner-*``
    (RBAC is the first layer). The pod name bound to the caller's token
    (``request.userInfo.extra['authentication.kubernetes.io/pod-name']``) must equal the name
    of the Runner or Lease written; a token bound to no pod is refused. A runner may register
    only into its own pool, may not set its control state, and may not touch the status fields
    the operator derives.
    """
    pod_key = "authentication.kubernetes.io/pod-name"
    unchanged = " && ".join(
        f"object.?status.?{field} == oldObject.?status.?{field}" for field in _OPERATOR_RUNNER_FIELDS
    )
    return build_admission_policy(
        RUNNER_POLICY_NAME,
        resource_rules=[
            resource_rule(GROUP, ["CREATE", "UPDATE", "DELETE"], ["runners", "runners/status"]),
            resource_rule("coordination.k8s.io", ["CREATE", "UPDATE", "DELETE"], ["leases"]),
        ],
        match_conditions=[
            {
                "name": "runner-service-account",
                "expression": (
                    "request.userInfo.username.matches('^system:serviceaccount:[^:]+:" + RUNNER_NAME_PREFIX + "[^:]+$')"
                ),
            }
        ],
        variables=[
            {
                "name": "podName",
                "expression": (
                    f"'{pod_key}' in request.userInfo.extra && "
                    f"size(request.userInfo.extra['{pod_key}']) > 0 ? "
                    f"request.userInfo.extra['{pod_key}'][0] : ''"
                ),
            },
            # request.subResource is absent (not empty) for a main resource such as a Lease.
            {"name": "subresource", "expression": "has(request.subResource) ? request.subResource : ''"},
            {
                "name": "target",
                "expression": (
                    "request.resource.resource + (variables.subresource != '' ? '/' + variables.subresource : '')"
                    " + ' ' + request.name"
                ),
            },
        ],
        validations=[
            {
                "expression": "variables.podName != ''",
                "messageExpression": (
                    "'runner identity: the token of ' + request.userInfo.username + ' is not bound to a pod; "
                    "a runner writes only with its pod-bound ServiceAccount token'"
                ),
                "reason": "Forbidden",
            },
            {
                "expression": "variables.podName == '' || variables.podName == request.name",
                "messageExpression": (
                    "'runner identity: runner pod ' + variables.podName + ' may write only its own Runner "
                    "and Lease (named ' + variables.podName + '), not ' + variables.target"
                ),
                "reason": "Forbidden",
            },
            {
                "expression": (
                    "request.resource.resource != 'runners' || request.operation != 'CREATE' || "
                    "(request.userInfo.username.endsWith(':"
                    + RUNNER_NAME_PREFIX
                    + "' + object.spec.poolRef.name) && !has(object.spec.controlState))"
                ),
                "messageExpression": (
                    "'runner identity: ' + request.userInfo.username + ' may register a Runner only in its "
                    "own pool and without a control state (spec.controlState is set by administrators)'"
                ),
                "reason": "Forbidden",
            },
            {
                "expression": (
                    "request.resource.resource != 'runners' || variables.subresource != 'status' || "
                    "request.operation != 'UPDATE' || (" + unchanged + ")"
                ),
                "messageExpression": (
                    "'runner identity: runner pod ' + variables.podName + ' may write only status.report; "
                    "the other status fields of ' + variables.target + ' are derived by the operator'"
                ),
                "reason": "Forbidden",
            },
        ],
    )


def build_change_approval(identity: OperatorIdentity) -> list[dict[str, Any]]:
    """Who may approve a Change's plan: the ``approve`` verb, in their own name.

    A ValidatingAdmissionPolicy lets ``spec.approvedPlan`` be set, changed or removed only by a
    principal RBAC allows the ``approve`` verb on ``changes.helmhive.dev`` (the pattern of
    CertificateSigningRequest approval), and only with ``by`` equal to their own username, so the
    operator's audit of who approved which digest is the API server's word, not the client's.
    The ``helmhive-change-approver`` ClusterRole grants it; bind it to the people who approve.
    """
    del identity  # the operator never approves
    changed = (
        "request.operation == 'CREATE' ? has(object.spec.approvedPlan) : "
        "object.spec.?approvedPlan != oldObject.spec.?approvedPlan"
    )
    allowed = (
        "authorizer.group('helmhive.dev').resource('changes').namespace(object.metadata.namespace)"
        ".name(object.metadata.name).check('approve').allowed()"
    )
    policy, binding = build_admission_policy(
        CHANGE_APPROVAL_POLICY_NAME,
        resource_rules=[resource_rule(GROUP, ["CREATE", "UPDATE"], ["changes"])],
        variables=[{"name": "approvalChanged", "expression": changed}],
        validations=[
            {
                "expression": f"!variables.approvalChanged || {allowed}",
                "messageExpression": (
                    "request.userInfo.username + ' may not approve change ' + object.metadata.name + "
                    "': approving needs the approve verb on changes.helmhive.dev (ClusterRole "
                    f"{CHANGE_APPROVER_ROLE})'"
                ),
                "reason": "Forbidden",
            },
            {
                "expression": (
                    "!variables.approvalChanged || !has(object.spec.approvedPlan) || "
                    "object.spec.approvedPlan.by == request.userInfo.username"
                ),
                "messageExpression": (
                    "'spec.approvedPlan.by must be your own username (' + request.userInfo.username + ')'"
                ),
                "reason": "Forbidden",
            },
        ],
    )
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": CHANGE_APPROVER_ROLE, "labels": dict(_LABELS)},
        "rules": [_rule([GROUP], ["changes"], ["get", "list", "watch", "patch", "approve"])],
    }
    return [policy, binding, role]


def build_audit_trail_policy(identity: OperatorIdentity) -> list[dict[str, Any]]:
    """A ValidatingAdmissionPolicy (and binding): nobody but the operator writes the audit trail.

    * **AuditRecords.** Only the operator's ServiceAccount may create or update one, and only it
      may delete one (its retention does), whatever RBAC allows -- cluster-admin included. The one
      other deletion allowed is a namespace's own: once a namespace is terminating, its records go
      with it (deleting a namespace needs RBAC on namespaces, and the records could not outlive it).
    * **What resets are counted by.** The operator records a session reset per count of a
      SessionBinding's ``status.resets``, so the count never goes down, and ``status.stored`` is
      turned off only together with a new count: a reset by ``kubectl`` is counted, and so audited,
      like one by ``helmhive sessions reset``.
    """
    username = identity.username
    audit = "request.resource.resource == 'auditrecords'"
    return build_admission_policy(
        AUDIT_POLICY_NAME,
        resource_rules=[
            resource_rule(GROUP, ["CREATE", "UPDATE", "DELETE"], ["auditrecords"]),
            resource_rule(GROUP, ["UPDATE"], ["sessionbindings/status"]),
        ],
        variables=[
            {"name": "operator", "expression": f"request.userInfo.username == '{username}'"},
            {
                "name": "namespaceTerminating",
                "expression": "namespaceObject != null && has(namespaceObject.metadata.deletionTimestamp)",
            },
            # A deletecollection's admission names no object; the record deleted is oldObject.
            {
                "name": "target",
                "expression": "oldObject != null ? oldObject.metadata.name : request.name",
            },
            {"name": "resetsBefore", "expression": "oldObject.?status.?resets.orValue(0)"},
            {"name": "resetsAfter", "expression": "object.?status.?resets.orValue(0)"},
        ],
        validations=[
            {
                "expression": f"!({audit}) || request.operation == 'DELETE' || variables.operator",
                "messageExpression": (
                    "'the audit trail is written only by the Helmhive operator (" + username + "): ' + "
                    "request.userInfo.username + ' may not ' + request.operation.lowerAscii() + ' an AuditRecord'"
                ),
                "reason": "Forbidden",
            },
            {
                "expression": (
                    f"!({audit}) || request.operation != 'DELETE' || variables.operator || "
                    "variables.namespaceTerminating"
                ),
                "messageExpression": (
                    "'the audit trail is append-only: ' + request.userInfo.username + ' may not delete "
                    "AuditRecord ' + variables.target + '; only the Helmhive operator (" + username + ") "
                    "deletes records, by its retention, and a namespace takes its own with it'"
                ),
                "reason": "Forbidden",
            },
            {
                "expression": f"{audit} || variables.resetsAfter >= variables.resetsBefore",
                "messageExpression": (
                    "'status.resets of session binding ' + request.name + ' only grows (from ' + "
                    "string(variables.resetsBefore) + '): each reset is audited by its count'"
                ),
                "reason": "Forbidden",
            },
            {
                "expression": (
                    f"{audit} || !(oldObject.?status.?stored.orValue(false) && "
                    "!object.?status.?stored.orValue(false)) || variables.resetsAfter > variables.resetsBefore"
                ),
                "messageExpression": (
                    "'turning off status.stored of session binding ' + request.name + ' is a reset: count it "
                    "by setting status.resets to ' + string(variables.resetsBefore + 1) + ' in the same write "
                    "(helmhive sessions reset does both)'"
                ),
                "reason": "Forbidden",
            },
        ],
    )


def build_install_manifests(identity: OperatorIdentity) -> list[dict[str, Any]]:
    """Everything a cluster needs besides the CRDs and the operator's Deployment."""
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": identity.namespace, "labels": dict(_LABELS)},
    }
    return [
        namespace,
        *build_operator_rbac(identity),
        *build_envelope_policy(identity),
        *build_runner_identity_policy(),
        *build_runner_execution_policy(),
        *build_change_approval(identity),
        *build_audit_trail_policy(identity),
        *build_session_compactions_policy(),
        *build_suggestion_export_policy(),
        *build_qualification_policy(identity),
    ]
