"""The Helmhive runner program: registers a Runner, keeps its Lease, reports, and drives an agent adapter.

Rooms, from the top: :mod:`.program` (the process and its loops) drives :mod:`.jobs` (one
AgentJob's life), which uses :mod:`.sessions`, :mod:`.source` and :mod:`.egress`; all of them rest
on :mod:`.sandbox`, :mod:`.adapters` and the shared modules here (the door :mod:`.kube`,
:mod:`.kube_pods`, :mod:`.config`, :mod:`.credentials`, :mod:`.logs`, :mod:`.metrics`,
:mod:`.patience`, :mod:`.watch_thread`); :mod:`.jobpod` is the job pod link and its programs.
The layers are an import-linter contract in ``pyproject.toml``.
Must not: import the operator's side (controller, CLI, Kopf) or the reference agent.
"""
