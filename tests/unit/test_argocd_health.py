"""Argo CD's health checks for Helmhive's kinds (``charts/helmhive/argocd``), run by a real Lua interpreter.

Argo CD runs a ``health.lua`` with the object as the global ``obj`` (gopher-lua, Lua 5.1) and reads
the table it returns; here LuaJIT (Lua 5.1's language, through lupa) does the same. Each kind's
``health_test.yaml`` is Argo CD's own test convention (``healthStatus`` and ``inputPath``), so the
same files run in Argo CD's repository unchanged. The reason tables inside the scripts are checked
against the Python sets they mirror, so a new final or retryable reason cannot be missed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from lupa import luajit21
from test_kstatus import CASES

from helmhive.api.reasons import Reason
from helmhive.policy.agentjob.retry import RETRYABLE_REASONS
from helmhive.policy.change.decision import TERMINAL_REASONS
from helmhive.policy.kstatus import (
    CHANGE_SUSPENDED_REASONS,
    DECIDERS,
    RUNNER_STARTING_REASONS,
    RUNNER_SUSPENDED_REASONS,
    WARM_POD_FAILED_REASONS,
)
from helmhive.policy.waiting import WAITING_REASONS

ROOT = Path(__file__).resolve().parents[2] / "charts" / "helmhive" / "argocd"
CHECKS = ROOT / "resource_customizations" / "helmhive.dev"
KINDS = ("AgentJob", "Change", "Runner", "RunnerPool")


def health(kind: str, obj: dict[str, Any]) -> dict[str, str]:
    """What Argo CD would show for ``obj``: the script's returned table, as a dict."""
    lua = luajit21.LuaRuntime(unpack_returned_tuples=True)
    to_lua = lua.eval(
        "function(py) local function conv(v) "
        "if python.builtins.isinstance(v, python.builtins.dict) then local t = {} "
        "for k in python.iter(v) do t[k] = conv(v[k]) end return t "
        "elseif python.builtins.isinstance(v, python.builtins.list) then local t = {} "
        "for i = 0, python.builtins.len(v) - 1 do t[i + 1] = conv(v[i]) end return t "
        "else return v end end return conv(py) end"
    )
    lua.globals().obj = to_lua(obj)
    script = (CHECKS / kind / "health.lua").read_text(encoding="utf-8")
    result = lua.execute(script)
    return {"status": str(result["status"]), "message": str(result["message"])}


def _cases() -> list[Any]:
    cases = []
    for kind in KINDS:
        tests = yaml.safe_load((CHECKS / kind / "health_test.yaml").read_text(encoding="utf-8"))["tests"]
        for test in tests:
            cases.append(pytest.param(kind, test, id=f"{kind}-{Path(test['inputPath']).stem}"))
    return cases


@pytest.mark.parametrize(("kind", "test"), _cases())
def test_each_kinds_check_answers_its_argo_cd_test_cases(kind: str, test: dict[str, Any]) -> None:
    obj = yaml.safe_load((CHECKS / kind / test["inputPath"]).read_text(encoding="utf-8"))
    assert obj["kind"] == kind
    assert health(kind, obj) == test["healthStatus"]


def test_every_kind_has_cases_for_each_status_it_can_show() -> None:
    shown = {kind: set() for kind in KINDS}
    for kind in KINDS:
        for test in yaml.safe_load((CHECKS / kind / "health_test.yaml").read_text(encoding="utf-8"))["tests"]:
            shown[kind].add(test["healthStatus"]["status"])
    assert shown == {
        "AgentJob": {"Progressing", "Healthy", "Degraded"},
        "Change": {"Progressing", "Suspended", "Healthy", "Degraded"},
        "Runner": {"Progressing", "Suspended", "Healthy", "Degraded"},
        "RunnerPool": {"Progressing", "Healthy", "Degraded"},
    }


def _with_ready(kind: str, status: str, reason: str, message: str = "m", ctype: str = "Ready") -> dict[str, Any]:
    cond = {"type": ctype, "status": status, "reason": reason, "message": message}
    return {"kind": kind, "metadata": {"name": "x", "generation": 1}, "status": {"conditions": [cond]}}


def test_a_change_is_degraded_for_each_final_reason_and_healthy_only_when_approved() -> None:
    for reason in TERMINAL_REASONS - {Reason.REVIEW_APPROVED}:
        assert health("Change", _with_ready("Change", "False", reason))["status"] == "Degraded", reason
    assert health("Change", _with_ready("Change", "True", Reason.REVIEW_APPROVED))["status"] == "Healthy"
    for reason in (Reason.AWAITING_APPROVAL, Reason.APPROVAL_DIGEST_MISMATCH):
        assert health("Change", _with_ready("Change", "False", reason))["status"] == "Suspended"
    for reason in (Reason.STAGE_RUNNING, Reason.STAGE_PENDING, Reason.WAITING_FOR_WORKSPACE):
        assert health("Change", _with_ready("Change", "False", reason))["status"] == "Progressing"


def test_a_job_failed_for_a_retryable_reason_is_progressing_until_the_operator_decides() -> None:
    for reason in RETRYABLE_REASONS:
        for detailed in (reason.value, f"{reason.value}:Evicted"):
            undecided = _with_ready("AgentJob", "False", detailed, "the pod went")
            assert health("AgentJob", undecided)["status"] == "Progressing", detailed
            decided = _with_ready("AgentJob", "False", detailed, "the pod went; not re-run: it may have written")
            assert health("AgentJob", decided)["status"] == "Degraded", detailed
    for reason in (Reason.NO_ELIGIBLE_RUNNER, Reason.TIMED_OUT, "ResourceLimitExceeded:memory", "JobPodFailed:X"):
        assert health("AgentJob", _with_ready("AgentJob", "False", reason))["status"] == "Degraded", reason


def test_a_runners_control_state_suspends_it_and_a_revoked_one_is_degraded() -> None:
    for reason, status in (
        (Reason.CONTROL_DRAINING, "Suspended"),
        (Reason.CONTROL_DISABLED, "Suspended"),
        (Reason.CONTROL_REVOKED, "Degraded"),
        (Reason.HEARTBEAT_STALE, "Degraded"),
        (Reason.CREDENTIAL_MISSING, "Degraded"),
        (Reason.CREDENTIAL_ROTATED, "Progressing"),
        (Reason.HEARTBEAT_HELD, "Progressing"),
    ):
        runner = _with_ready("Runner", "False", reason, ctype="Schedulable")
        assert health("Runner", runner)["status"] == status, reason


def test_argocd_cm_carries_exactly_the_scripts() -> None:
    config = yaml.safe_load((ROOT / "argocd-cm.yaml").read_text(encoding="utf-8"))
    assert config["kind"] == "ConfigMap" and config["metadata"]["name"] == "argocd-cm"
    assert config["data"] == {
        f"resource.customizations.health.helmhive.dev_{kind}": (CHECKS / kind / "health.lua").read_text(
            encoding="utf-8"
        )
        for kind in KINDS
    }


def _lua_table(kind: str, name: str) -> set[str]:
    """The keys of ``local <name> = {A = true, ...}`` in ``kind``'s script."""
    script = (CHECKS / kind / "health.lua").read_text(encoding="utf-8")
    found = re.search(rf"local {name} = \{{([^}}]*)\}}", script)
    assert found is not None, f"{kind}'s script has no table {name}"
    return set(re.findall(r"(\w+) = true", found.group(1)))


def test_the_scripts_reason_tables_are_the_python_sets_kstatus_uses() -> None:
    assert _lua_table("AgentJob", "retryable") == set(RETRYABLE_REASONS)
    assert _lua_table("AgentJob", "waiting") == set(WAITING_REASONS)
    assert _lua_table("Change", "final") == set(TERMINAL_REASONS - {Reason.REVIEW_APPROVED})
    assert _lua_table("Change", "human") == set(CHANGE_SUSPENDED_REASONS)
    assert _lua_table("Runner", "suspended") == set(RUNNER_SUSPENDED_REASONS)
    assert _lua_table("Runner", "starting") == set(RUNNER_STARTING_REASONS)
    pool = (CHECKS / "RunnerPool" / "health.lua").read_text(encoding="utf-8")
    assert set(re.findall(r'warm\.reason == "(\w+)"', pool)) == set(WARM_POD_FAILED_REASONS)


_ARGO = {"Progressing": "Progressing", "Ready": "Healthy", "Failed": "Degraded", "Suspended": "Suspended"}


@pytest.mark.parametrize(
    ("kind", "case", "status"),
    [pytest.param(k, case, s, id=f"{k}-{case}") for k, case, s, _, _ in CASES if k in KINDS],
)
def test_argo_cd_and_kstatus_read_each_state_alike(kind: str, case: str, status: dict[str, Any]) -> None:
    """Argo CD's Healthy/Progressing/Degraded/Suspended is kstatus's Ready/Progressing/Failed/Suspended."""
    obj = {"kind": kind, "metadata": {"name": "x", "generation": 1}, "status": status}
    assert health(kind, obj)["status"] == _ARGO[DECIDERS[kind](status).progress.value], case
