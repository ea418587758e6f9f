"""docs/execution.md shows exactly the Role rules and admission policy the operator installs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from helmhive.deploy.runner_execution import build_runner_execution_policy
from helmhive.policy.runners.pool import EXECUTION_ROLE_RULES, PoolRef, build_role

DOC = Path(__file__).resolve().parents[2] / "docs" / "execution.md"


def _block(marker: str) -> list[Any]:
    match = re.search(
        rf"<!-- {re.escape(marker)} -->\s*```yaml\n(.*?)\n```", DOC.read_text(encoding="utf-8"), re.DOTALL
    )
    assert match, marker
    return [d for d in yaml.safe_load_all(match.group(1)) if d]


def test_documented_role_rules_are_the_built_ones() -> None:
    (documented,) = _block("execution-role-rules")
    role = build_role(PoolRef(name="POOL", namespace="ns", uid="u"), replicas=2)
    built = [r for r in role["rules"] if r in [dict(x) for x in EXECUTION_ROLE_RULES] or "resourceNames" in r]
    assert sorted(map(repr, documented)) == sorted(map(repr, built))


def test_documented_policy_is_the_built_one() -> None:
    documented = _block("execution-admission-policy")
    built = build_runner_execution_policy()
    for doc in built:
        doc["metadata"].pop("labels")
    assert documented == built
