"""Runners and RunnerPools, pure: derived state, freshness, the pod a pool makes, credentials.

Owns: a Runner's derived state and a pool's counts (:mod:`.state`), freshness from the Lease
(:mod:`.freshness`), what the operator writes about a Runner (:mod:`.status`), the objects a
pool becomes (:mod:`.pool`, :mod:`.pod`), and credential rotation (:mod:`.credentials`).
May import: audit and the shared pure modules.
"""
