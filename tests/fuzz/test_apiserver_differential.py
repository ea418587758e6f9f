"""The API server and ``helmhive validate`` agree on every single-object rule: a differential test.

Each mutant (:mod:`fuzz.mutants`) is validated offline alone and sent to the real kube-apiserver
of the harness as a server-side dry-run create (nothing is stored), with the CRDs installed and
the real operator running, so its admission webhook judges profiles. Both must accept, or both
must refuse. Every disagreement is listed at the end, with the mutation that made it. The one
known exception, counted apart, is the API server admitting a list at a ``date-time`` field
(:func:`fuzz.apiserver.known_server_leniency`), which the operator then marks ``InvalidSpec``.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from kubernetes import client

from harness.operator import OperatorProcess
from helmhive.policy.violations import split_field_path

from .apiserver import known_server_leniency, offline_issues, place, sendable, server_verdict
from .budget import Tally, fuzz_settings
from .mutants import Mutant, example_set, mutants, targeted


def _same_field(server: tuple[str, ...], offline: list[str]) -> bool:
    """Whether the API server and validate name the same field (or one inside the other)."""
    ours = [split_field_path(p) for p in offline]
    for field in server:
        theirs = split_field_path(field)
        if any(a[: len(theirs)] == theirs or theirs[: len(a)] == a for a in ours if a and theirs):
            return True
    return False


def test_the_api_server_agrees_with_validate_on_every_mutant(
    kube: Any, crds: list[str], operator: OperatorProcess, namespace: str
) -> None:
    custom: client.CustomObjectsApi = kube.custom
    tally = Tally("differential: dry-run create vs helmhive validate")
    disagreements: list[str] = []

    # Every seed alone is accepted by both (a precondition: a refusal of a mutant is the mutation's).
    for seed in example_set():
        body = place(seed, namespace)
        verdict = server_verdict(custom, body)
        assert verdict.accepted, (seed["kind"], seed["metadata"]["name"], verdict)
        assert not offline_issues(body), offline_issues(body)

    @fuzz_settings(200)
    @given(mutant=st.one_of(targeted(example_set()), mutants()))
    def run(mutant: Mutant) -> None:
        if not sendable(mutant.body):
            tally.add("not sendable (no Helmhive kind or broken metadata)")
            return
        body = place(mutant.body, namespace)
        issues = offline_issues(body)
        verdict = server_verdict(custom, body)
        tally.add("tried")
        if bool(issues) != verdict.accepted:
            tally.add("refused" if issues else "accepted")
            if issues and verdict.fields:
                named = _same_field(verdict.fields, [i.field_path for i in issues])
                tally.add("refused, same field named" if named else "refused, other fields named")
        elif issues and known_server_leniency(body):
            tally.add("refused offline, admitted by the API server's known leniency")
        else:
            tally.add("disagreements")
            offline = "; ".join(f"{i.field_path}: {i.reason.value}: {i.message}" for i in issues) or "accepted"
            server = f"{'accepted' if verdict.accepted else 'refused'} ({verdict.status}) {verdict.message[:400]}"
            disagreements.append(f"{mutant.describe()}\n  validate: {offline[:400]}\n  server:   {server}")

    run()
    record = tally.report()
    assert record.get("tried", 0) >= 50, record
    assert not disagreements, f"{len(disagreements)} disagreements:\n" + "\n".join(disagreements[:40])
