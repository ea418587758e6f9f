"""A governed change, pure: from a Change and the jobs it owns to the next action.

Owns: the decision (:mod:`.decision`) and what it is built from (:mod:`.builder`), each stage's
job names and outputs (:mod:`.jobs`), and each stage's immutable request text (:mod:`.prompts`).
May import: the AgentJob life, audit names and the shared pure modules.
"""
