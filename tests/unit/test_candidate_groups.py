"""The candidate table's stored form: consecutive like rows grouped, and nothing lost.

``status.routing.candidates`` stores the table decide_route returns as groups of consecutive rows
that differ only in runner. These tests hold the grouping to being lossless (the table comes back
row for row, in order, through the wire form and through the API model) and to merging only what
is alike and adjacent.
"""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st
from routing_builders import NOW, binding, job, runner

from helmhive.api.crdgen import build_crd
from helmhive.api.job import AgentJobStatus, Candidate, RoutingStatus
from helmhive.api.kinds import kind_by_name
from helmhive.policy.routing import MAX_CANDIDATES, build_routing_status, decide_route
from helmhive.policy.routing_status import build_candidate_groups, build_candidate_rows

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


@settings(max_examples=300, deadline=None)
@given(_ROWS)
def test_the_groups_give_the_table_back_row_for_row(rows: list[Candidate]) -> None:
    groups = build_candidate_groups(rows)

    assert build_candidate_rows(groups) == [row.to_wire() for row in rows]
    parsed = RoutingStatus.model_validate({"candidates": groups})  # what a reader of the status parses
    assert parsed.rows() == rows
    # Only adjacent like rows merge: two neighbouring groups always differ in more than runner.
    keys = [{k: v for k, v in g.items() if k != "runners"} for g in groups]
    assert all(a != b for a, b in itertools.pairwise(keys))
    assert sum(len(g["runners"]) for g in groups) == len(rows)


def test_like_rows_that_are_not_adjacent_stay_apart() -> None:
    def row(name: str, reason: str) -> Candidate:
        return Candidate(runner=name, namespace="team", provider="anthropic", mapping_index=0, reason=reason)

    rows = [row("a", "Selected"), row("b", "NamespaceNotServed"), row("c", "Selected")]

    assert [g["runners"] for g in build_candidate_groups(rows)] == [["a"], ["b"], ["c"]]


def test_a_full_table_of_like_runners_is_stored_as_two_groups_and_parses_as_a_status() -> None:
    runners = [runner(f"r{i:02d}") for i in range(40)]
    decision = decide_route(job=job(), binding=binding(), runners=runners, active_jobs={}, now=NOW)

    routing = build_routing_status(decision=decision, attempts=0, now=NOW)
    groups = routing["candidates"]

    assert len(decision.candidates) == MAX_CANDIDATES
    assert [(len(g["runners"]), g["reason"]) for g in groups] == [(1, "Selected"), (19, "NotPreferred:NameOrder")]
    status = AgentJobStatus.model_validate({"routing": routing})
    assert status.routing is not None and tuple(status.routing.rows()) == decision.candidates


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
