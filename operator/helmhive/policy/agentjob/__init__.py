"""An AgentJob's life, pure: its state read once, one status patch per step, and who writes which field.

Owns: the read model (:mod:`.state`), the step table and patches (:mod:`.patch`, :mod:`.steps`,
re-exported by :mod:`.life`), retry and the failed and lost decisions, the operator's watch
decisions, prompts and bounded results.
Must not: import routing; the router's step is :mod:`helmhive.policy.routing.step`, so that
routing reads jobs and never the other way round.
"""
