"""Pure builders of the manifests that install Helmhive: identity, RBAC and admission policy.

The Helm chart in ``charts/helmhive`` renders the same objects (a test compares them), and
the test harness and ``helmhive dev`` apply these directly. Nothing here does I/O.
"""

from __future__ import annotations

from typing import Any

from helmhive.api.kinds import GROUP

__all__ = [
    "OperatorIdentity",
    "build_envelope_policy",
    "build_install_manifests",
    "build_operator_rbac",
]

_LABELS = {"app.kubernetes.io/name": "helmhive", "app.kubernetes.io/part-of": "helmhive"}
ENVELOPE_POLICY_NAME = "helmhive-envelopes-read-only"


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
        _rule([""], ["pods"], [*_READ, "delete"]),
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
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": ENVELOPE_POLICY_NAME, "labels": dict(_LABELS)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [GROUP],
                        "apiVersions": ["*"],
                        "operations": ["CREATE", "UPDATE", "DELETE"],
                        "resources": ["envelopes", "envelopes/status"],
                    }
                ]
            },
            "validations": [
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
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": ENVELOPE_POLICY_NAME, "labels": dict(_LABELS)},
        "spec": {"policyName": ENVELOPE_POLICY_NAME, "validationActions": ["Deny"]},
    }
    return [policy, binding]


def build_install_manifests(identity: OperatorIdentity) -> list[dict[str, Any]]:
    """Everything a cluster needs besides the CRDs and the operator's Deployment."""
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": identity.namespace, "labels": dict(_LABELS)},
    }
    return [namespace, *build_operator_rbac(identity), *build_envelope_policy(identity)]
