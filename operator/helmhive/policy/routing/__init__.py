"""Routing, pure: which runner runs a queued job, with which model, or the named reason why none can.

Owns: the decision (:mod:`.route`, over :mod:`.model`, :mod:`.candidates`, :mod:`.prepared`,
:mod:`.outcomes`), its status wire form and the router's step (:mod:`.status`, :mod:`.step`),
what routing reads of the fleet (:mod:`.fleet`, :mod:`.inputs`), and the operator's store of
AgentJob facts (:mod:`.job_store`).
May import: the AgentJob life, memory selection and the shared pure modules.
"""
