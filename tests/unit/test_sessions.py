"""Session decisions: keyed continuity, fresh for governed work, resume and fork only from a stored session."""

from __future__ import annotations

from typing import Any

import pytest

from helmhive.api.common import SessionPolicy
from helmhive.api.job import SessionMode
from helmhive.api.profile import SessionScope
from helmhive.policy.sessions.continuity import SessionIntent, decide_session, sessions_secret_name

BASE: dict[str, Any] = {
    "policy": SessionPolicy.RESUME,
    "governed": False,
    "scope": SessionScope.SERVICE,
    "workspace": "payments",
    "profile": "quick-review",
    "provider": "anthropic",
    "runner": "pool-a-0",
    "credential_generation": 3,
    "service": "api",
    "existing": {},
}


def _decide(**overrides: Any) -> Any:
    return decide_session(**{**BASE, **overrides})


def test_governed_and_fresh_bind_nothing() -> None:
    for decision in (_decide(governed=True), _decide(policy=SessionPolicy.FRESH)):
        assert decision.mode is SessionMode.FRESH
        assert decision.binding_name is None


def test_a_new_chain_starts_fresh_then_resumes_once_stored() -> None:
    first = _decide()
    assert (first.mode, first.intent) == (SessionMode.FRESH, SessionIntent.FRESH)
    assert first.binding_name is not None and first.binding_name.startswith("sb-")
    again = _decide(existing={first.binding_name: {"stored": True}})
    assert (again.mode, again.intent) == (SessionMode.RESUMED, SessionIntent.RESUME)
    assert again.binding_name == first.binding_name
    fork = _decide(policy=SessionPolicy.FORK, existing={first.binding_name: {"stored": True}})
    assert (fork.mode, fork.intent) == (SessionMode.FORKED, SessionIntent.FORK)


@pytest.mark.parametrize(
    "change",
    [
        {"runner": "pool-a-1"},
        {"credential_generation": 4},
        {"provider": "google"},
        {"profile": "other"},
        {"workspace": "ledger"},
        {"service": "ledger"},
    ],
)
def test_every_key_part_starts_its_own_chain(change: dict[str, Any]) -> None:
    assert _decide(**change).binding_name != _decide().binding_name


def test_service_scope_without_a_service_binds_at_workspace_scope() -> None:
    decision = _decide(service=None)
    assert decision.binding is not None
    assert decision.binding.scope is SessionScope.WORKSPACE
    assert "workspace scope" in decision.reason
    assert _decide(service=None, scope=SessionScope.WORKSPACE).binding_name == decision.binding_name


def test_sessions_secret_is_per_runner() -> None:
    assert sessions_secret_name("pool-a-0") == "helmhive-sessions-pool-a-0"
    assert sessions_secret_name("pool-a-0") != sessions_secret_name("pool-a-1")
