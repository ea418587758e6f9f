"""The one builder of Helmhive's ValidatingAdmissionPolicies and their cluster-wide Deny bindings.

Every policy Helmhive installs has the same frame -- ``failurePolicy: Fail``, a list of resource
rules, optional match conditions and variables, its validations, and a binding that denies what
the policy does not allow; the modules that own a policy (``manifests``, ``session_compactions``)
give only what tells theirs apart. Keys come out in one order, so the rendered YAML is stable. Pure.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LABELS", "build_admission_policy", "build_deny_binding", "resource_rule"]

LABELS = {"app.kubernetes.io/name": "helmhive", "app.kubernetes.io/part-of": "helmhive"}
_API_VERSION = "admissionregistration.k8s.io/v1"


def resource_rule(group: str, operations: list[str], resources: list[str]) -> dict[str, Any]:
    """One ``matchConstraints.resourceRules`` entry, for every version of ``group``."""
    return {"apiGroups": [group], "apiVersions": ["*"], "operations": operations, "resources": resources}


def build_deny_binding(policy_name: str) -> dict[str, Any]:
    """A cluster-wide binding that makes ``policy_name`` deny what it does not allow."""
    return {
        "apiVersion": _API_VERSION,
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": policy_name, "labels": dict(LABELS)},
        "spec": {"policyName": policy_name, "validationActions": ["Deny"]},
    }


def build_admission_policy(
    name: str,
    *,
    resource_rules: list[dict[str, Any]],
    validations: list[dict[str, Any]],
    match_conditions: list[dict[str, Any]] | None = None,
    variables: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The policy ``name`` and its Deny binding; ``matchConditions``/``variables`` only when given."""
    spec: dict[str, Any] = {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": resource_rules}}
    if match_conditions is not None:
        spec["matchConditions"] = match_conditions
    if variables is not None:
        spec["variables"] = variables
    spec["validations"] = validations
    policy = {
        "apiVersion": _API_VERSION,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": dict(LABELS)},
        "spec": spec,
    }
    return [policy, build_deny_binding(name)]
