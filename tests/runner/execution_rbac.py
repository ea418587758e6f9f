"""The runner's execution RBAC and admission policy, from the same builders the operator installs.

The tests create exactly what :func:`helmhive.policy.runners.pool.build_role` and
:func:`helmhive.deploy.runner_execution.build_runner_execution_policy` build, and
``tests/unit/test_execution_docs.py`` checks that ``docs/execution.md`` shows the same.
"""

from __future__ import annotations

import copy
from typing import Any

from kubernetes import client

from helmhive.deploy.runner_execution import build_runner_execution_policy
from helmhive.policy.runners.pool import EXECUTION_ROLE_RULES, sessions_secret_names


def execution_role_rules(pool: str) -> list[dict[str, Any]]:
    """The execution rules of pool ``pool``'s Role (two replicas' sessions Secrets)."""
    rules = [copy.deepcopy(dict(rule)) for rule in EXECUTION_ROLE_RULES]
    rules.append(
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": sessions_secret_names(pool, 2),
            "verbs": ["get", "patch"],
        }
    )
    return rules


def as_policy_rules(rules: list[dict[str, Any]]) -> list[client.V1PolicyRule]:
    return [
        client.V1PolicyRule(
            api_groups=rule["apiGroups"],
            resources=rule["resources"],
            verbs=rule["verbs"],
            resource_names=rule.get("resourceNames"),
        )
        for rule in rules
    ]


def execution_admission_policy(*, name: str, namespace: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The execution policy and binding, renamed ``name`` and bound to ``namespace`` only."""
    policy, binding = copy.deepcopy(build_runner_execution_policy())
    policy["metadata"]["name"] = name
    binding["metadata"]["name"] = name
    binding["spec"]["policyName"] = name
    binding["spec"]["matchResources"] = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    }
    return policy, binding
