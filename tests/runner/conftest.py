"""Fixtures for the runner's agent-layer tests: the reference agent driven over real stdio."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from helmhive.reference_agent.session import ENV_MODE, ENV_STATE_DIR
from helmhive.runner.adapters import AcpAdapter, AcpAdapterConfig

from .agent_harness import REFERENCE_AGENT, AdapterFactory, MethodLog


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    path = tmp_path / "agent-state"
    path.mkdir()
    return path


@pytest.fixture
def method_log(state_dir: Path) -> MethodLog:
    return MethodLog(state_dir)


@pytest.fixture
def workdir(tmp_path: Path) -> str:
    path = tmp_path / "work"
    path.mkdir()
    return str(path)


@pytest.fixture
async def make_adapter(state_dir: Path) -> AsyncIterator[AdapterFactory]:
    """Build ACP adapters for the reference agent (short timeouts); all are closed afterwards."""
    assert REFERENCE_AGENT.exists(), "the helmhive-reference-agent console script is not installed"
    made: list[AcpAdapter] = []

    def factory(
        mode: str = "",
        *,
        extra_env: dict[str, str] | None = None,
        secret_env: dict[str, str] | None = None,
        command: str | None = None,
        **overrides: Any,
    ) -> AcpAdapter:
        env = {ENV_STATE_DIR: str(state_dir), **(extra_env or {})}
        if mode:
            env[ENV_MODE] = mode
        settings: dict[str, Any] = {
            "command": command or str(REFERENCE_AGENT),
            "env": env,
            "secret_env": {key: SecretStr(value) for key, value in (secret_env or {}).items()},
            "idle_timeout_s": 1.0,
            "cancel_grace_s": 1.0,
            "request_timeout_s": 20.0,
            "probe_cwd": str(state_dir),
        }
        settings.update(overrides)
        adapter = AcpAdapter(AcpAdapterConfig(**settings))
        made.append(adapter)
        return adapter

    yield factory
    for adapter in made:
        await adapter.close()


@pytest.fixture
def rig(kube: Any, namespace: str, service_account_identity: Any, crds: list[str], tmp_path: Path) -> Iterator[Any]:
    """A runner pool's identity and files in a fresh namespace; every runner it starts is stopped afterwards."""
    from .program_harness import RunnerRig

    made = RunnerRig(kube=kube, namespace=namespace, identities=service_account_identity, root=tmp_path / "rig")
    yield made
    made.stop_all()


@pytest.fixture
def execution(
    kube: Any, namespace: str, service_account_identity: Any, crds: list[str], tmp_path: Path
) -> Iterator[Any]:
    """Run AgentJobs on runner programs in a fresh namespace, under the execution RBAC and admission policy."""
    from .execution_harness import ExecutionRig

    rig = ExecutionRig(kube=kube, namespace=namespace, identities=service_account_identity, root=tmp_path / "exec")
    rig.install_admission_policy()
    yield rig
    rig.cleanup()
