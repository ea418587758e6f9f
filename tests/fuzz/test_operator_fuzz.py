"""The operator never crashes on what the API server accepted; it marks each object with a condition.

A sample of mutants the API server accepts (by dry run) is created for real, with the real
operator running, in one namespace where most references lead nowhere (no Workspace named
``payments``, no runners): each object must carry a condition in ``status.conditions``, the
operator process must still be alive, and its log must hold no Python traceback.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from kubernetes import client

from harness.operator import OperatorProcess
from harness.wait import wait_for
from helmhive.api.kinds import GROUP, KINDS, VERSION

from .apiserver import place, sendable, server_verdict
from .budget import Tally, fuzz_settings, scaled
from .mutants import Mutant, example_set, mutants, targeted

# The kinds a user creates and the operator reconciles into a condition.
OPERATED = ("Profile", "MemoryRecord", "Workspace", "AgentJob", "Change", "RunnerPool")
PLURALS = {k.kind: k.plural for k in KINDS}


def _conditions(custom: client.CustomObjectsApi, namespace: str, kind: str, name: str) -> list[dict[str, Any]]:
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURALS[kind], name)
    return list((obj.get("status") or {}).get("conditions") or [])


def test_the_operator_marks_every_accepted_mutant_with_a_condition(
    kube: Any, crds: list[str], operator: OperatorProcess, namespace: str
) -> None:
    custom: client.CustomObjectsApi = kube.custom
    tally = Tally("operator: accepted mutants created for real")
    created: list[tuple[str, str, str]] = []
    limit = scaled(30)
    seeds = tuple(s for s in example_set() if s["kind"] in OPERATED)

    @fuzz_settings(120)
    @given(mutant=st.one_of(targeted(seeds), mutants(seeds)))
    def run(mutant: Mutant) -> None:
        if len(created) >= limit or not sendable(mutant.body) or mutant.body["kind"] not in OPERATED:
            return
        body = place(mutant.body, namespace)
        body["metadata"]["name"] = f"fz{len(created)}-{body['metadata'].get('name') or 'x'}"[:60].rstrip("-.")
        tally.add("tried")
        if not server_verdict(custom, body).accepted:
            tally.add("refused by the API server")
            return
        kind = body["kind"]
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURALS[kind], copy.deepcopy(body))
        created.append((kind, body["metadata"]["name"], mutant.describe()))
        tally.add("created")

    run()
    # The API server's own leniency: a list where a date-time string belongs is stored as is.
    quirk = copy.deepcopy(next(s for s in example_set() if s["metadata"]["name"] == "api-freeze-q4"))
    quirk["metadata"]["name"] = "fz-expires-at-a-list"
    quirk["spec"]["expiresAt"] = ["2027-01-15T00:00:00Z"]
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "memoryrecords", place(quirk, namespace))
    created.append(("MemoryRecord", "fz-expires-at-a-list", "spec.expiresAt is a list"))

    assert len(created) >= min(limit, 10), tally.report()

    def all_marked() -> bool:
        unmarked = {
            f"{kind}/{name}": why for kind, name, why in created if not _conditions(custom, namespace, kind, name)
        }
        if unmarked:
            raise AssertionError(f"no condition yet on {unmarked}")
        return True

    wait_for(all_marked, timeout=180, interval=2, describe="a condition on every created object")
    assert operator.proc is not None and operator.proc.poll() is None, operator.log_tail()
    assert "Traceback" not in operator.log_text(), operator.log_tail(200)
    reasons = {
        f"{kind}: {c['type']}={c['status']} {c['reason']}"
        for kind, name, _ in created
        for c in _conditions(custom, namespace, kind, name)
    }
    print("conditions seen:", sorted(reasons))
    tally.add("marked", len(created))
    tally.report()
