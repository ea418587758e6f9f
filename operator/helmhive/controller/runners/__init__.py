"""Runners and RunnerPools on the operator's side: derived status, owned objects, credentials, job pods, wakes.

Owns: the operator's share of each Runner's ``status`` (:mod:`.derived`, never ``report``), the
reconcile of each RunnerPool into its owned objects and counts (:mod:`.pools`), its credential
check (:mod:`.credentials`), a JobPod pool's link key and warm pods (:mod:`.jobpods`), and which
runners changed since their pool's loop last ran (:mod:`.wakes`).
May import: the runtime, the door, the audit writer and the pure core.
"""
