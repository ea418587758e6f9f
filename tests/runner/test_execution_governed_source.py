"""The exact source as a governed job sees it: named failures on the job, the cache, the credential.

The runner fetches the job's commit before the agent starts; what goes wrong ends the job with
the source's own reason. A private repository's credential (the pool's mounted Secret) is a
canary here: it must never appear in the job's status, in an Event, in the runner's log, in
what the agent was told or could see, nor in a check's evidence. Real runner program, API
server, reference agent, ``git daemon`` and smart HTTP on loopback.
"""

from __future__ import annotations

import base64
import json
import socket
from pathlib import Path
from typing import Any

from harness.gitserver import GitHttpServer, GitRepo
from helmhive.api.common import JobKind

from .execution_governed import GovernedRig, governed
from .execution_harness import condition

__all__ = ["governed"]

FILES = {"README.md": "# private\n"}
GIT_USER = "helmhive-bot"
GIT_CANARY = "gitpw-canary-5d1e8f2a9c7b4e36-do-not-leak"


def _ended(job: dict[str, Any]) -> tuple[str, str, str]:
    cond = condition(job, "Succeeded")
    assert cond is not None
    return cond["status"], cond["reason"], cond["message"]


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_source_failures_end_the_job_with_their_own_reason(governed: GovernedRig) -> None:
    repo = governed.repo("app", FILES)
    runner = governed.execution.start_runner()
    missing_commit = "1234567890abcdef1234567890abcdef12345678"
    cases = {
        "no-commit": (governed.source(repo, missing_commit), "CommitNotFound", missing_commit),
        "no-repo": (governed.source("nowhere"), "RepositoryNotFound", "nowhere.git"),
        "no-server": (
            {"repository": f"git://127.0.0.1:{_closed_port()}/app.git", "commit": repo.head},
            "SourceUnavailable",
            "could not be fetched",
        ),
    }
    for name, (source, _, _) in cases.items():
        governed.create(name, runner=runner, kind=JobKind.CHANGE_PLANNING, source=source)
    for name, (_, reason, said) in cases.items():
        job = governed.execution.wait_finished(name)
        status, got, message = _ended(job)
        assert (status, got) == ("False", reason), (name, job["status"])
        assert said in message and job["status"]["result"]["outcome"] == reason
        warning = governed.execution.wait_events(name, reason)  # posted after the final status
        assert warning[0].type == "Warning"
    assert not runner.prompts()  # no agent starts without its source
    assert not list((runner.rig.state_dir / "jobs").iterdir())


def _credentials(root: Path, password: str) -> Path:
    directory = root / "git-credentials"
    directory.mkdir(parents=True)
    (directory / "username").write_text(GIT_USER + "\n")
    (directory / "password").write_text(password + "\n")
    return directory


def _texts(governed: GovernedRig, runner_log: str, agent_state: Path) -> dict[str, str]:
    """Everything the canary must stay out of: objects, Events, the runner's log, the agent's own logs."""
    execution = governed.execution
    custom = execution.kube.custom
    objects = {
        plural: custom.list_namespaced_custom_object("helmhive.dev", "v1alpha1", execution.namespace, plural)
        for plural in ("agentjobs", "runners", "sessionbindings")
    }
    config_maps = execution.kube.core.list_namespaced_config_map(execution.namespace).to_dict()
    events = execution.kube.core.list_namespaced_event(execution.namespace).to_dict()
    agent_files = {p.name: p.read_text(errors="replace") for p in agent_state.rglob("*") if p.is_file()}
    return {
        "objects": json.dumps(objects),
        "configmaps": json.dumps(config_maps, default=str),
        "events": json.dumps(events, default=str),
        "runner log": runner_log,
        **{f"agent {name}": text for name, text in agent_files.items()},
    }


def test_a_private_repository_is_fetched_with_the_pools_credential_which_never_leaks(
    governed: GovernedRig, tmp_path: Path
) -> None:
    repo = GitRepo.create(root=tmp_path / "private", name="secret-app", files=FILES)
    with GitHttpServer(root=tmp_path / "private", username=GIT_USER, password=GIT_CANARY) as server:
        source = {"repository": server.url_for(repo), "commit": repo.head}
        credentials = _credentials(tmp_path / "right", GIT_CANARY)
        runner = governed.execution.start_runner(runner_env={"HELMHIVE_SOURCE_CREDENTIALS_DIR": str(credentials)})
        checks = [
            {"name": "peek", "command": ["sh", "-c", f"env; cat {credentials}/password; ls -la {credentials}"]},
            {"name": "cache", "command": ["sh", "-c", f"ls {runner.rig.state_dir}/source-cache ../source.git"]},
        ]
        governed.create(
            "first",
            runner=runner,
            kind=JobKind.CHANGE_IMPLEMENTATION,
            directives=("APPEND-LINE: README.md :: private change",),
            source=source,
            checks=checks,
        )
        first = governed.execution.wait_finished("first")
        assert _ended(first)[:2] == ("True", "Completed"), first["status"]
        fetched = len(server.requests)
        assert fetched > 0 and all(r.authorized for r in server.requests)

        # Neither the credential nor the runner's git state is within a check's reach.
        peek, cache = first["status"]["result"]["checks"]
        assert peek["outcome"] == "Failed" and "Permission denied" in peek["outputTail"]
        assert cache["outcome"] == "Failed" and "Permission denied" in cache["outputTail"]

        # A second job at the same commit is served from the runner's cache: the server is not asked.
        governed.create(
            "second",
            runner=runner,
            kind=JobKind.CHANGE_PLANNING,
            source=source,
        )
        assert _ended(governed.execution.wait_finished("second"))[:2] == ("True", "Completed")
        assert len(server.requests) == fetched

        # The same repository with a wrong password ends the job SourceAuthFailed.
        wrong = governed.execution.start_runner(
            index=1, runner_env={"HELMHIVE_SOURCE_CREDENTIALS_DIR": str(_credentials(tmp_path / "wrong", "nope"))}
        )
        governed.create("refused", runner=wrong, kind=JobKind.CHANGE_PLANNING, source=source)
        status, reason, message = _ended(governed.execution.wait_finished("refused"))
        assert (status, reason) == ("False", "SourceAuthFailed") and "refused the git credentials" in message
        # The final Event comes after the status: wait for it, so the sweep below reads every Event.
        governed.execution.wait_events("refused", "SourceAuthFailed")

    basic = base64.b64encode(f"{GIT_USER}:{GIT_CANARY}".encode()).decode()
    logs = "\n".join(proc.raw_log() for r in governed.execution.runners for proc in r.rig.procs)
    for runner_ in governed.execution.runners:
        for where, text in _texts(governed, logs, runner_.agent_state).items():
            assert GIT_CANARY not in text and basic not in text, where
