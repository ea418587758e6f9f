"""A RunnerSet's remembered static checks give exactly the decisions a plain list of runners gives.

The operator's router hands decide_route one :class:`RunnerSet` per fleet and decides thousands
of jobs over it; the static part of each runner's check is computed once per requirement and
reused. Over generated cases (the fast-path test's generator: every kind of rejection, overrides,
review diversity, loads, sessions) a set reused across many decisions, with changing loads,
jobs and profiles, must decide as the earlier implementation (:mod:`routing_oracle_v1`) does.
"""

from __future__ import annotations

import random
from typing import Any

import routing_oracle_v1 as oracle
from hypothesis import given, settings
from hypothesis import strategies as st
from routing_builders import NOW, binding, job, mapping, runner
from test_routing_fast_path import cases

from helmhive.policy.routing.prepared import RunnerSet
from helmhive.policy.routing.route import decide_route


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(cases(), min_size=1, max_size=4), st.randoms(use_true_random=False))
def test_a_reused_runner_set_decides_as_the_oracle(batch: list[dict[str, Any]], rnd: random.Random) -> None:
    # One fleet (the first case's runners), several jobs and profiles over it, each twice with other loads.
    fleet = RunnerSet(batch[0]["runners"])
    assert list(fleet) == batch[0]["runners"] and len(fleet) == len(batch[0]["runners"])
    for case in batch * 2:
        active = {r.key: rnd.randint(0, 5) for r in fleet}
        over_fleet = {**case, "runners": fleet, "active_jobs": active}
        expected = oracle.decide_route(**{**over_fleet, "runners": list(fleet)})
        assert decide_route(**over_fleet) == expected


def test_the_set_remembers_checks_per_requirement_and_a_new_fleet_starts_afresh() -> None:
    runners = [runner(f"r{i}", "anthropic", models=["m1"], concurrency=1) for i in range(3)]
    fleet = RunnerSet(runners)
    profile = binding(mapping("anthropic", "m1"))
    full = {r.key: 1 for r in runners[:2]}
    first = decide_route(job=job(), binding=profile, runners=fleet, active_jobs=full, now=NOW)
    assert first.choice is not None and first.choice.runner == "r2"
    # Same requirement, other loads: the remembered checks, a fresh capacity check.
    second = decide_route(job=job(), binding=profile, runners=fleet, active_jobs={}, now=NOW)
    assert second.choice is not None and second.choice.runner == "r0"
    # Another model: another requirement, checked afresh (no runner advertises it).
    other = decide_route(job=job(), binding=binding(mapping("anthropic", "m9")), runners=fleet, active_jobs={}, now=NOW)
    assert other.choice is None and other.reason.value == "ModelNotAdvertised"
    # A fleet that changed is a new set: a runner that now advertises m9 is found.
    changed = RunnerSet([*runners, runner("r3", "anthropic", models=["m9"], concurrency=1)])
    found = decide_route(
        job=job(), binding=binding(mapping("anthropic", "m9")), runners=changed, active_jobs={}, now=NOW
    )
    assert found.choice is not None and found.choice.runner == "r3"


def test_table_rows_are_built_once_and_equal_rows_built_afresh(monkeypatch: Any) -> None:
    """A burst builds the same rows decision after decision: each is built once, and reads as built afresh."""
    from helmhive.api.job import Candidate
    from helmhive.policy.routing import candidates as routing_candidates

    monkeypatch.setattr(routing_candidates, "_ROWS", {})
    runners = [runner(f"r{i}", "anthropic", models=["m1"], concurrency=2) for i in range(5)]
    fleet = RunnerSet(runners)
    profile = binding(mapping("anthropic", "m1"))
    first = decide_route(job=job(), binding=profile, runners=fleet, active_jobs={}, now=NOW)
    again = decide_route(job=job(), binding=profile, runners=fleet, active_jobs={}, now=NOW)
    assert first == again and all(a is b for a, b in zip(first.candidates, again.candidates, strict=True))
    for row in first.candidates:
        assert row == Candidate.model_validate(row.to_wire())  # a valid row, equal to one built afresh
    # Another load: some rows change reason, and each changed row is a new object with that reason.
    busy = decide_route(job=job(), binding=profile, runners=fleet, active_jobs={runners[0].key: 2}, now=NOW)
    by_runner = {row.runner: row for row in busy.candidates}
    assert by_runner["r0"].reason == "NoFreeConcurrency" and by_runner["r0"] is not first.candidates[0]
    assert busy == oracle.decide_route(job=job(), binding=profile, runners=runners,
                                       active_jobs={runners[0].key: 2}, now=NOW)  # fmt: skip


def test_the_row_memo_is_bounded(monkeypatch: Any) -> None:
    from helmhive.policy.routing import candidates as routing_candidates

    memo: dict[Any, Any] = {}
    monkeypatch.setattr(routing_candidates, "_ROWS", memo)
    monkeypatch.setattr(routing_candidates, "_ROWS_KEPT", 4)
    profile = binding(mapping("anthropic", "m1"))
    for size in (3, 6, 9):
        fleet = RunnerSet([runner(f"s{size}-{i}", "anthropic", models=["m1"]) for i in range(size)])
        decision = decide_route(job=job(), binding=profile, runners=fleet, active_jobs={}, now=NOW)
        assert len(decision.candidates) == size
        assert len(memo) <= 4
