"""The candidate table's stored form: like rows grouped, and nothing lost.

``status.routing.candidates`` stores the table decide_route returns as groups: the rows that
differ only in runner share one group, its runners in table order, the groups in the order of
their closest row. These tests hold the grouping to keeping every row and that order, through
the wire form and through the API model, and to merging exactly the rows that are alike.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from routing_builders import NOW, binding, job, runner

from helmhive.api.crdgen import build_crd
from helmhive.api.job import AgentJobStatus, Candidate, RoutingStatus
from helmhive.api.kinds import kind_by_name
from helmhive.policy.routing.route import MAX_CANDIDATES, build_routing_status, decide_route
from helmhive.policy.routing.status import build_candidate_groups, build_candidate_rows

_NAMES = st.from_regex(r"[a-z][a-z0-9-]{0,6}[a-z0-9]", fullmatch=True)
# Few distinct values, so runs of like rows (and like rows that are not adjacent) are common.
_ROWS = st.lists(
    st.builds(
        Candidate,
        runner=_NAMES,
        namespace=st.sampled_from([None, "team", "other"]),
        provider=st.sampled_from([None, "anthropic", "openai"]),
        mapping_index=st.sampled_from([None, 0, 1]),
        model=st.sampled_from([None, "sonnet", "gpt-5"]),
        reason=st.sampled_from(["Selected", "NotPreferred:NameOrder", "NamespaceNotServed"]),
    ),
    max_size=MAX_CANDIDATES,
)


def _key(row: Candidate) -> tuple[object, ...]:
    return (row.namespace, row.provider, row.mapping_index, row.model, row.reason)


@settings(max_examples=300, deadline=None)
@given(_ROWS)
def test_the_groups_keep_every_row_each_group_in_table_order(rows: list[Candidate]) -> None:
    groups = build_candidate_groups(rows)

    # The expected rows: like rows together, each group where its first row was, rows in table order.
    first: dict[tuple[object, ...], int] = {}
    for index, row in enumerate(rows):
        first.setdefault(_key(row), index)
    expected = sorted(rows, key=lambda r: first[_key(r)])  # stable: table order within a group
    assert build_candidate_rows(groups) == [row.to_wire() for row in expected]
    parsed = RoutingStatus.model_validate({"candidates": groups})  # what a reader of the status parses
    assert parsed.rows() == expected
    # Exactly the like rows merge: no two groups differ only in their runners.
    keys = [tuple(sorted((k, str(v)) for k, v in g.items() if k != "runners")) for g in groups]
    assert len(keys) == len(set(keys))
    assert all(g["runners"] for g in groups)


def test_like_rows_that_are_not_adjacent_share_a_group_at_the_first_ones_place() -> None:
    def row(name: str, reason: str) -> Candidate:
        return Candidate(runner=name, namespace="team", provider="anthropic", mapping_index=0, reason=reason)

    rows = [row("a", "Selected"), row("b", "NamespaceNotServed"), row("c", "Selected")]

    assert [g["runners"] for g in build_candidate_groups(rows)] == [["a", "c"], ["b"]]


def test_a_full_table_of_like_runners_is_stored_as_two_groups_and_parses_as_a_status() -> None:
    runners = [runner(f"r{i:02d}") for i in range(40)]
    decision = decide_route(job=job(), binding=binding(), runners=runners, active_jobs={}, now=NOW)

    routing = build_routing_status(decision=decision, attempts=0, now=NOW)
    groups = routing["candidates"]

    assert len(decision.candidates) == MAX_CANDIDATES
    assert [(len(g["runners"]), g["reason"]) for g in groups] == [(1, "Selected"), (19, "NotPreferred:NameOrder")]
    status = AgentJobStatus.model_validate({"routing": routing})
    assert status.routing is not None and tuple(status.routing.rows()) == decision.candidates


def test_runners_of_different_loads_interleave_in_the_table_and_are_stored_as_one_group_per_reason() -> None:
    # Every odd runner runs a job already: it loses on load, the others on name order.
    runners = [runner(f"r{i:02d}", concurrency=4) for i in range(40)]
    active = {("team", f"r{i:02d}"): 1 for i in range(1, 40, 2)}
    decision = decide_route(job=job(), binding=binding(), runners=runners, active_jobs=active, now=NOW)

    reasons = [c.reason for c in decision.candidates]
    assert reasons[1:4] == ["NotPreferred:MoreLoaded", "NotPreferred:NameOrder", "NotPreferred:MoreLoaded"]
    groups = build_routing_status(decision=decision, attempts=0, now=NOW)["candidates"]
    assert [g["reason"] for g in groups] == ["Selected", "NotPreferred:MoreLoaded", "NotPreferred:NameOrder"]
    assert sorted(r.runner for r in RoutingStatus.model_validate({"candidates": groups}).rows()) == sorted(
        c.runner for c in decision.candidates
    )
    assert groups[1]["runners"] == [c.runner for c in decision.candidates if c.reason == "NotPreferred:MoreLoaded"]


def test_a_row_stored_before_groups_reads_as_a_group_of_one() -> None:
    old = {"runner": "old-runner", "namespace": "team", "provider": "anthropic", "reason": "Selected"}
    new = {"runners": ["a", "b"], "namespace": "team", "reason": "NotPreferred:NameOrder"}

    parsed = RoutingStatus.model_validate({"candidates": [old, new]})

    assert [(r.runner, r.reason) for r in parsed.rows()] == [
        ("old-runner", "Selected"),
        ("a", "NotPreferred:NameOrder"),
        ("b", "NotPreferred:NameOrder"),
    ]
    assert [r["runner"] for r in build_candidate_rows([old, new])] == ["old-runner", "a", "b"]


def test_the_schema_keeps_the_old_rows_runner_so_an_upgrade_prunes_nothing() -> None:
    # The API server prunes, on every read, a stored field its schema does not declare.
    root = build_crd(kind_by_name("AgentJob"))["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    row = root["properties"]["status"]["properties"]["routing"]["properties"]["candidates"]["items"]

    assert {"runner", "runners"} <= set(row["properties"])
    assert row["properties"]["runner"]["type"] == "string"
    assert row["properties"]["runners"]["items"]["type"] == "string"


def test_an_old_row_is_written_back_as_it_was_read() -> None:
    old = {"runner": "old-runner", "namespace": "team", "reason": "Selected"}

    assert RoutingStatus.model_validate({"candidates": [old]}).to_wire()["candidates"] == [old]
