"""What one probe did not learn, the runner keeps from the last one that did (pure).

A probe that never reached the agent, or learnt no efforts per model, must not make routing
refuse jobs the runner can run (``decide_learnt``); and the catalogue names only efforts learnt
(``build_catalogue``): a model the probe did not learn has none named, which routing reads as unknown.
"""

from __future__ import annotations

from helmhive.runner.adapters.base import AdapterReport, AgentCapabilities
from helmhive.runner.program.report import build_catalogue, decide_learnt


def _report(**update: object) -> AdapterReport:
    base = AdapterReport(
        adapter="acp",
        adapter_version="0.1.0",
        agent_name="agent",
        agent_version="1.0",
        models=["small", "large"],
        default_model="small",
        capabilities=AgentCapabilities(load_session=True),
        capabilities_known=True,
        model_efforts={"small": ["low", "high"], "large": []},
    )
    return base.model_copy(update=update)


def test_a_probe_that_learnt_nothing_keeps_the_last_advertisement_and_efforts() -> None:
    previous = _report()
    blind = _report(capabilities=AgentCapabilities(), capabilities_known=False, model_efforts={})
    kept = decide_learnt(previous=previous, current=blind)
    assert kept.capabilities_known and kept.capabilities.load_session
    assert kept.model_efforts == previous.model_efforts


def test_a_new_agent_version_or_model_list_is_not_given_the_old_efforts() -> None:
    previous = _report()
    upgraded = _report(agent_version="2.0", model_efforts={})
    assert decide_learnt(previous=previous, current=upgraded).model_efforts == {}
    more_models = _report(models=["small", "large", "huge"], model_efforts={})
    assert decide_learnt(previous=previous, current=more_models).model_efforts == {}
    # What this probe did learn wins over the last one.
    fresh = _report(model_efforts={"small": ["low"]})
    assert decide_learnt(previous=previous, current=fresh).model_efforts == {"small": ["low"]}
    assert decide_learnt(previous=None, current=fresh) is fresh


def test_the_catalogue_names_only_efforts_learnt() -> None:
    catalogue = build_catalogue(adapter=_report(model_efforts={"small": ["low", "high"]}, effort_levels=["low"]))
    efforts = {m.id: m.efforts for m in catalogue.models}
    assert efforts == {"small": ["low", "high"], "large": None}
    none_offered = build_catalogue(adapter=_report())
    assert {m.id: m.efforts for m in none_offered.models}["large"] == []
