"""Offline validation (``helmhive validate``): schema, single-object rules and cross-object rules.

Owns: the run over a set of manifests (:mod:`.manifests`), its values (:mod:`.model`), what the
API server checks beyond JSON Schema (:mod:`.apiserver`, :mod:`.rules`), and the rules across
objects (:mod:`.refs`).
May import: profiles, memory, envelopes and violations.
"""
