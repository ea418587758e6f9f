"""The routing benchmark's pure parts (``benchmarks/routing/``, ``bench_runners.py``).

The like-for-like baseline must patch what the router writes for a bench job: the status is
built by the router's own pure core, and these tests hold it to the API models and to the
queue step's binding, so the baseline cannot drift from the write it stands for. The CPU
windows are read from samples; their arithmetic is checked on made-up ones and on /proc.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from bench_runners import CpuProbe, CpuSample, cpu_window, machine_busy_seconds
from routing.baseline import build_like_router_status, like_router_patches, tiny_patch
from routing.process import synced_from_log
from routing.report import ratios
from routing.settings import BENCH_PROFILE_SPEC, NS

from helmhive.api.job import AgentJobStatus
from helmhive.controller.jobs.binding import _profile_verdict
from helmhive.policy.routing.route import MAX_CANDIDATES
from helmhive.policy.routing.status import build_candidate_rows

NOW = dt.datetime(2026, 12, 2, 11, 0, tzinfo=dt.UTC)


def test_the_like_for_like_status_is_what_the_router_writes_for_an_assigned_bench_job() -> None:
    status = build_like_router_status(runners=30, concurrency=10, now=NOW)

    assert sorted(status) == ["assignment", "conditions", "observedGeneration", "profile", "routing"]
    parsed = AgentJobStatus.model_validate(status)  # the API models accept it as a job's status
    # It round-trips unchanged (the model adds only its default ``attempts: 0``): nothing dropped or reshaped.
    assert parsed.to_wire() == {"attempts": 0, **status}
    assert parsed.routing is not None and parsed.assignment is not None and parsed.profile is not None
    assert len(parsed.routing.rows()) == MAX_CANDIDATES
    assert parsed.routing.considered_runners == 30
    assert [c.reason for c in parsed.routing.rows()].count("Selected") == 1
    assert parsed.assignment.runner in {c.runner for c in parsed.routing.rows()}
    assert parsed.assignment.runner_namespace == NS
    conditions = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert conditions == {
        "Routed": ("True", "Assigned"),
        "Ready": ("Unknown", "Assigned"),
        "Reconciling": ("True", "Assigned"),  # kstatus: assigned, not run yet
    }


def test_the_like_for_like_binding_is_the_queue_steps_binding_of_the_bench_profile() -> None:
    status = build_like_router_status(runners=30, concurrency=10, now=NOW)
    spec, invalid, snapshot, digest = _profile_verdict({"metadata": {"name": "bench"}, "spec": BENCH_PROFILE_SPEC})

    assert spec is not None and not invalid
    assert status["profile"]["snapshot"] == snapshot
    assert status["profile"]["hash"] == digest
    assert status["profile"]["revision"].startswith("bench-")


def test_fewer_runners_than_the_table_gives_one_row_each() -> None:
    status = build_like_router_status(runners=5, concurrency=10, now=NOW)
    assert len(build_candidate_rows(status["routing"]["candidates"])) == 5


def test_every_like_for_like_patch_changes_the_object_and_keeps_its_size() -> None:
    status = build_like_router_status(runners=200, concurrency=10, now=NOW)
    body = like_router_patches(status)
    patches = [orjson.loads(body("raw-0", i)) for i in range(0, 40, 4)]  # one slot's successive patches of a job

    assert len({json.dumps(p, sort_keys=True) for p in patches}) == len(patches)
    for patch in patches:
        assert {k: v for k, v in patch["status"].items() if k != "routing"} == {
            k: v for k, v in status.items() if k != "routing"
        }
        assert len(build_candidate_rows(patch["status"]["routing"]["candidates"])) == MAX_CANDIDATES
    sizes = {len(body("raw-0", i)) for i in range(0, 1000, 7)}
    assert max(sizes) - min(sizes) < 8  # only the counter's digits and the time move


def test_the_tiny_patch_is_the_issues_raw_patch() -> None:
    assert orjson.loads(tiny_patch("raw-0", 61234)) == {"status": {"attempts": 1234, "routing": {"attempts": 234}}}


def test_the_backlog_ratio_is_bracketed_by_the_tiny_rates_before_and_after_the_run() -> None:
    raw = {"parallel": 200.0, "like_router": 100.0, "like_router_put": 125.0, "tiny_fresh_again": 160.0}
    burst = {"jobs_per_second": 50.0, "backlog": {"jobs_per_second_first_to_last": 120.0}}
    before = ratios({"raw": raw, "burst": burst})
    assert before["backlog_to_raw"] == 0.6
    assert before["backlog_to_raw_again"] == 0.75
    assert before["backlog_to_raw_bracket"] is None  # no rate after the run yet
    after = ratios({"raw": {**raw, "tiny_after_run": 300.0}, "burst": burst})
    assert after["backlog_to_raw_bracket"] == 120.0 / 250.0
    assert ratios({"raw": raw, "burst": {"jobs_per_second": 50.0}})["backlog_to_raw_bracket"] is None


def test_a_window_is_read_between_samples_and_costed_per_item() -> None:
    probe = CpuProbe(pids={})
    probe.samples = [
        CpuSample(at=10.0, machine=100.0, procs={"kube-apiserver": 5.0}),
        CpuSample(at=12.0, machine=104.0, procs={"kube-apiserver": 7.0, "operator": 1.0}),
        CpuSample(at=14.0, machine=106.0, procs={"kube-apiserver": 8.0, "operator": 2.0}),
    ]

    middle = probe.at(11.0)
    assert (middle.machine, middle.procs) == (102.0, {"kube-apiserver": 6.0})  # operator: not in both samples
    window = cpu_window(probe.at(11.0), probe.at(13.0), count=4)
    assert window["seconds"] == 2.0
    assert window["cpu_seconds"] == {"kube-apiserver": 1.5}
    assert window["ms_per_item"] == {"kube-apiserver": 375.0}
    assert window["machine_busy_cores"] == 1.5
    assert probe.at(99.0) is probe.samples[-1] and probe.at(0.0) is probe.samples[0]


def test_the_probe_reads_this_process_and_the_machine_from_proc() -> None:
    probe = CpuProbe(pids={"bench client": os.getpid(), "gone": 2**22 + 1})
    before = probe.sample()
    after = before
    deadline = time.monotonic() + 10
    # Burn CPU until the kernel has counted it, for this process and for the machine: the two
    # counters are updated separately (/proc/stat may lag the process's own by a tick).
    while (
        after.procs["bench client"] <= before.procs["bench client"] or after.machine <= before.machine
    ) and time.monotonic() < deadline:
        sum(i * i for i in range(100_000))
        after = probe.sample()

    assert "gone" not in before.procs  # a pid with no process is left out, not an error
    assert after.procs["bench client"] > before.procs["bench client"]
    assert after.machine > before.machine > 0  # this process's ticks are the machine's too
    assert machine_busy_seconds() >= after.machine


def test_the_restart_reads_the_store_sync_from_the_operators_own_log_line() -> None:
    """Kopf caches probe answers for 10 s, so the benchmark falls back to the line the operator logs."""
    line = (
        '{"message": "agentjob store synced: 10000 jobs (20 pages, 10000 copies newer than the store\'s), '
        '10000 holding a runner, 0 vanished, 19.4 s after start-up", "severity": "info"}'
    )
    relisted = '{"message": "agentjob store listed again: 3 jobs (1 pages, 0 copies newer than the store\'s)"}'
    assert synced_from_log("other\n" + line + "\n" + relisted) == 19.4
    assert synced_from_log(relisted) is None
