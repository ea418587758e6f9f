"""The runner's execution RBAC and admission policy, read from ``docs/execution.md``.

The page holds the exact Role rules and ValidatingAdmissionPolicy the runner needs beyond the
contract; the tests create exactly those objects from it, so the page and the tests cannot drift.
"""

from __future__ import annotations

import copy
import re
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

DOC = Path(__file__).resolve().parents[2] / "docs" / "execution.md"


@cache
def _block(marker: str) -> tuple[Any, ...]:
    text = DOC.read_text(encoding="utf-8")
    match = re.search(rf"<!-- {re.escape(marker)} -->\s*```yaml\n(.*?)\n```", text, re.DOTALL)
    assert match, f"docs/execution.md has no yaml block after <!-- {marker} -->"
    return tuple(yaml.safe_load_all(match.group(1)))


def execution_role_rules(pool: str) -> list[dict[str, Any]]:
    """The Role rules of ``docs/execution.md`` for pool ``pool`` (replicas 0 and 1)."""
    (rules,) = _block("execution-role-rules")
    out = copy.deepcopy(rules)
    for rule in out:
        if "resourceNames" in rule:
            rule["resourceNames"] = [name.replace("POOL", pool) for name in rule["resourceNames"]]
    return list(out)


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
    """The policy and binding of ``docs/execution.md``, renamed ``name`` and bound to ``namespace`` only."""
    policy, binding = copy.deepcopy(_block("execution-admission-policy"))
    policy["metadata"]["name"] = name
    binding["metadata"]["name"] = name
    binding["spec"]["policyName"] = name
    binding["spec"]["matchResources"] = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    }
    return policy, binding
