"""The metrics catalogue, its documentation, bounded labels, and the scrape-time collectors.

The endpoints themselves are scraped during real runs in ``tests/operator/test_metrics_cluster.py``.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from helmhive.api.common import ControlState
from helmhive.api.reasons import Reason
from helmhive.controller import metrics as operator_metrics
from helmhive.controller.kube.door import Kube
from helmhive.controller.router.gauges import build_state_snapshot
from helmhive.controller.router.handlers import Router, RouterSettings
from helmhive.controller.runtime import Runtime
from helmhive.kubeclient import Conflict
from helmhive.metricdefs import Catalogue, MetricSpec
from helmhive.policy.agentjob.life import parse_agent_job
from helmhive.policy.routing.inputs import parse_pool, parse_runner
from helmhive.runner import metrics as runner_metrics
from helmhive.runner.adapters.base import CancelOrigin, TurnOutcome, TurnResult
from helmhive.runner.config import RunnerConfig, RunnerEnvironment, RunnerFileConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "observability.md"
ROW = re.compile(r"^\| `(helmhive_[a-z0-9_]+)` \| (\w+) \| ([^|]*) \|")


def _documented() -> dict[str, tuple[str, tuple[str, ...]]]:
    rows = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        match = ROW.match(line)
        if match:
            name, kind, labels = match.groups()
            assert name not in rows, f"{name} is documented twice"
            rows[name] = (kind, tuple(re.findall(r"`([a-z_]+)`", labels)))
    return rows


def _registered() -> dict[str, tuple[str, tuple[str, ...]]]:
    specs = [*operator_metrics.CATALOGUE.specs, *runner_metrics.CATALOGUE.specs]
    return {s.name: (s.type, s.labels) for s in specs}


def _exposed(text: str) -> dict[str, str]:
    """Metric family names (as exposed) -> type, for Helmhive's own families."""
    found = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("helmhive_"):
            found[family.name + "_total" if family.type == "counter" else family.name] = family.type
    return found


def test_the_docs_list_exactly_the_metrics_the_code_registers_with_their_types_and_labels() -> None:
    assert _documented() == _registered()


def test_every_helmhive_family_a_registry_exposes_is_in_its_catalogue() -> None:
    for module in (operator_metrics, runner_metrics):
        exposed = _exposed(generate_latest(module.REGISTRY).decode())
        # The text format has no info type: an info metric is a gauge that is always 1.
        assert exposed == {s.name: "gauge" if s.type == "info" else s.type for s in module.CATALOGUE.specs}


def test_names_follow_the_prometheus_conventions() -> None:
    for name, (kind, labels) in _registered().items():
        assert name.startswith("helmhive_"), name
        assert re.fullmatch(r"[a-z][a-z0-9_]*", name), name
        assert (kind == "counter") == name.endswith("_total"), name
        if kind == "histogram":
            assert name.endswith("_seconds"), name
        assert not {"name", "job", "runner", "pool", "namespace", "model", "message"} & set(labels), name
    with pytest.raises(ValueError, match="_total"):
        Catalogue().counter("helmhive_things", "no suffix")
    catalogue = Catalogue()
    catalogue.gauge("helmhive_x", "x")
    with pytest.raises(ValueError, match="twice"):
        catalogue.gauge("helmhive_x", "again")
    assert catalogue.specs == [MetricSpec(name="helmhive_x", type="gauge", labels=(), help="x")]


# -- the operator's recording helpers ----------------------------------------------------------------


def _value(name: str, **labels: str) -> float:
    return operator_metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def _finished_job(reason: str, *, status: str = "False", started: bool = True) -> dict[str, Any]:
    result = {"completedAt": "2026-01-01T10:01:30Z"}
    if started:
        result["startedAt"] = "2026-01-01T10:00:00Z"
    return {
        "metadata": {"name": "job-with-a-unique-name", "namespace": "team-a"},
        "spec": {"jobKind": "review-probe"},
        "status": {
            "assignment": {"provider": "unit-provider", "runner": "r-0"},
            "conditions": [{"type": "Succeeded", "status": status, "reason": reason, "message": "free text here"}],
            "result": result,
        },
    }


def test_a_finished_job_is_counted_with_its_fixed_reason_and_run_time() -> None:
    labels = {"job_kind": "review-probe", "provider": "unit-provider", "outcome": "Failed"}
    before = _value("helmhive_jobs_finished_total", reason="AgentFailed", **labels)
    count = _value("helmhive_job_duration_seconds_count", **labels)
    total = _value("helmhive_job_duration_seconds_sum", **labels)
    operator_metrics.record_job_finished(parse_agent_job(_finished_job("AgentFailed:RunnerError")))
    assert _value("helmhive_jobs_finished_total", reason="AgentFailed", **labels) == before + 1
    assert _value("helmhive_job_duration_seconds_count", **labels) == count + 1
    assert _value("helmhive_job_duration_seconds_sum", **labels) == total + 90.0
    # A reason that is not one of ours never becomes a label value; a job that never started has no run time.
    other = _value("helmhive_jobs_finished_total", reason="Other", **labels)
    operator_metrics.record_job_finished(parse_agent_job(_finished_job("free text: no", started=False)))
    assert _value("helmhive_jobs_finished_total", reason="Other", **labels) == other + 1
    assert _value("helmhive_job_duration_seconds_count", **labels) == count + 1


def test_a_job_that_has_not_finished_is_not_counted() -> None:
    before = sum(s.value for m in operator_metrics.JOBS_FINISHED.collect() for s in m.samples)
    operator_metrics.record_job_finished(parse_agent_job(_finished_job("Started", status="Unknown")))
    requeued = _finished_job("Completed")
    requeued["status"]["conditions"] = []
    operator_metrics.record_job_finished(parse_agent_job(requeued))
    assert sum(s.value for m in operator_metrics.JOBS_FINISHED.collect() for s in m.samples) == before


def test_queue_step_decisions_and_api_writes_are_counted_by_fixed_names() -> None:
    waiting = _value("helmhive_jobs_routed_total", outcome="WaitingForReference", reason="WaitingForProfile")
    failed = _value("helmhive_jobs_routed_total", outcome="Failed", reason="ProfileNotFound")
    operator_metrics.record_queue_decision(reason=Reason.WAITING_FOR_PROFILE, waiting=True)
    operator_metrics.record_queue_decision(reason=Reason.PROFILE_NOT_FOUND, waiting=False)
    assert (
        _value("helmhive_jobs_routed_total", outcome="WaitingForReference", reason="WaitingForProfile") == waiting + 1
    )
    assert _value("helmhive_jobs_routed_total", outcome="Failed", reason="ProfileNotFound") == failed + 1

    write = {"kind": "AgentJob", "verb": "patch", "subresource": "status"}
    ok, conflict = (
        _value("helmhive_api_writes_total", result="Success", **write),
        _value("helmhive_api_writes_total", result="Conflict", **write),
    )
    operator_metrics.record_api_write(**write)
    operator_metrics.record_api_write(**write, error=Conflict(409, "the object has been modified"))
    operator_metrics.record_api_write(**write, error=OSError("connection reset"))
    assert _value("helmhive_api_writes_total", result="Success", **write) == ok + 1
    assert _value("helmhive_api_writes_total", result="Conflict", **write) == conflict + 1
    assert _value("helmhive_api_writes_total", result="Error", **write) >= 1


# -- the operator's scrape-time gauges, read on a running event loop ---------------------------------


def _runner(name: str, *, provider: str, schedulable: bool, control: str = "Active", status: str = "Online") -> Any:
    report = {
        "provider": provider,
        "adapter": {"type": "acp", "name": "agent", "version": "1"},
        "authentication": {"state": "Authenticated", "reason": "SessionCreated", "message": ""},
        "concurrency": 2,
        "activeJobs": 0,
        "environmentFingerprint": "sha256:" + "0" * 64,
        "catalogue": {"models": [], "default": None},
        "credentialGeneration": 1,
        "podName": name,
        "reportedAt": "2026-01-01T10:00:00Z",
        "registeredAt": "2026-01-01T10:00:00Z",
    }
    body = {
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"poolRef": {"name": f"{provider}-pool"}},
        "status": {
            "report": report,
            "reportedStatus": status,
            "effectiveControlState": control,
            "conditions": [
                {
                    "type": "Schedulable",
                    "status": "True" if schedulable else "False",
                    "reason": "Schedulable" if schedulable else "NotOnline",
                    "message": "",
                    "lastTransitionTime": "2026-01-01T10:00:00Z",
                }
            ],
        },
    }
    facts = parse_runner(body)
    assert facts is not None and facts.report is not None, body
    return facts


def _pool(provider: str) -> Any:
    body = {
        "metadata": {"name": f"{provider}-pool", "namespace": "team-a"},
        "spec": {
            "provider": provider,
            "adapter": {"type": "acp", "acp": {"command": "agent"}},
            "image": "example/runner:1",
            "credential": {"secretRef": {"name": "s", "key": "k"}},
        },
    }
    pool = parse_pool(body)
    assert pool is not None
    return pool


@pytest.fixture
def running_loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.close()


def test_scrape_time_gauges_count_runners_slots_and_queues_on_the_event_loop(
    running_loop: asyncio.AbstractEventLoop,
) -> None:
    router = Router(Runtime(kube=Kube(client.ApiClient())), RouterSettings())
    router.runners = {
        "team-a": [
            _runner("a-0", provider="anthropic", schedulable=True),
            _runner("a-1", provider="anthropic", schedulable=False, control="Draining"),
            _runner("o-0", provider="openai", schedulable=False, status="Offline"),
        ]
    }
    router.pools = {"team-a": [_pool("anthropic"), _pool("openai"), _pool("idle")]}
    router.jobs_by_runner = {("team-a", "a-0"): [("team-a", "job-1")]}
    router.queued[("team-a", "job-2")] = "event"
    state = operator_metrics.OperatorState()
    assert state.snapshot() is None  # not bound: no samples, no error
    state.bind(read=lambda: build_state_snapshot(router), loop=running_loop)
    families = {f.name: f for f in state.collect()}

    def samples(name: str) -> dict[tuple[str, ...], float]:
        return {tuple(s.labels.values()): s.value for s in families[name].samples}

    assert samples("helmhive_runners") == {
        ("anthropic", "Active", "Online", "true"): 1,
        ("anthropic", "Draining", "Online", "false"): 1,
        ("openai", "Active", "Offline", "false"): 1,
    }
    # A provider with pools but no schedulable runner shows 0, so "== 0" can alert on it.
    assert samples("helmhive_schedulable_runners") == {("anthropic",): 1, ("idle",): 0, ("openai",): 0}
    assert samples("helmhive_schedulable_slots") == {("anthropic",): 2, ("idle",): 0, ("openai",): 0}
    assert samples("helmhive_schedulable_slots_busy") == {("anthropic",): 1, ("idle",): 0, ("openai",): 0}
    assert samples("helmhive_routing_queue_depth") == {(): 1}
    assert samples("helmhive_jobs_waiting_for_capacity") == {(): 0}
    state.unbind()
    assert all(not f.samples for f in state.collect())


# -- the runner's ---------------------------------------------------------------------------------------


def _config() -> RunnerConfig:
    env = RunnerEnvironment(
        runner_name="r-0", namespace="team-a", pool="p", config_path=Path("/x"), credential_file=Path("/c")
    )
    file = RunnerFileConfig.model_validate(
        {"provider": "unit-runner", "adapter": {"type": "acp", "acp": {"command": "a"}}}
    )
    return RunnerConfig(env=env, file=file)


def _runner_value(name: str, **labels: str) -> float:
    return runner_metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_killed_turn_counts_as_a_turn_a_cancellation_and_a_kill() -> None:
    ids = {"provider": "unit-runner", "adapter": "acp"}
    turns = _runner_value("helmhive_runner_adapter_turns_total", outcome="Killed", **ids)
    cancels = _runner_value("helmhive_runner_adapter_cancellations_total", origin="Watchdog", **ids)
    kills = _runner_value("helmhive_runner_adapter_kills_total", **ids)
    killed = TurnResult(outcome=TurnOutcome.KILLED, cancel_origin=CancelOrigin.WATCHDOG, duration_s=12.5)
    runner_metrics.record_turn(config=_config(), result=killed)
    runner_metrics.record_turn(config=_config(), result=TurnResult(outcome=TurnOutcome.COMPLETED, duration_s=1.0))
    assert _runner_value("helmhive_runner_adapter_turns_total", outcome="Killed", **ids) == turns + 1
    assert _runner_value("helmhive_runner_adapter_cancellations_total", origin="Watchdog", **ids) == cancels + 1
    assert _runner_value("helmhive_runner_adapter_kills_total", **ids) == kills + 1
    assert _runner_value("helmhive_runner_adapter_turn_duration_seconds_sum", outcome="Killed", **ids) >= 12.5


class _Process:
    def __init__(self, view: runner_metrics.RunnerGauges) -> None:
        self.view = view

    def metrics_view(self) -> runner_metrics.RunnerGauges:
        return self.view


def test_the_runner_gauges_show_its_one_control_state_and_its_slots() -> None:
    state = runner_metrics.RunnerState()
    assert all(not f.samples for f in state.collect())
    state.bind(
        _Process(
            runner_metrics.RunnerGauges(
                provider="unit-runner",
                adapter="acp",
                version="0.1.0",
                control_state=ControlState.DRAINING,
                auth_state=None,
                active_jobs=1,
                slots=2,
                last_heartbeat=None,
            )
        )
    )
    families = {f.name: f for f in state.collect()}
    control = {s.labels["state"]: s.value for s in families["helmhive_runner_control_state"].samples}
    assert control == {"Active": 0, "Draining": 1, "Disabled": 0, "Revoked": 0}
    assert not families["helmhive_runner_auth_state"].samples  # nothing reported yet
    assert [s.value for s in families["helmhive_runner_jobs_active"].samples] == [1]
    assert [s.value for s in families["helmhive_runner_job_slots"].samples] == [2]
    assert not families["helmhive_runner_last_heartbeat_timestamp_seconds"].samples


# -- the Grafana dashboard --------------------------------------------------------------------------------

DASHBOARD = Path(__file__).resolve().parents[2] / "charts" / "helmhive" / "dashboards" / "helmhive.json"


def test_the_dashboard_queries_only_metrics_the_code_registers() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["datasource"]
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
    assert exprs
    known = set(_registered())
    used = {name for expr in exprs for name in re.findall(r"helmhive_[a-z0-9_]+", expr)}
    series = {re.sub(r"_(bucket|count|sum)$", "", name) for name in used}
    assert series <= known, series - known
    # Every metric family shows up somewhere, except the info metric (it is for joins, not a panel).
    assert known - series <= {"helmhive_runner_info", "helmhive_runner_probes_total", "helmhive_runner_control_state"}
