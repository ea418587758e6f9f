"""Audit records, pure: their shape and retention, the routing trail, and the core/v1 Events posted beside them.

Owns: AuditRecord building and retention (:mod:`.records`), routing decision entries and the
audit object names every trail uses (:mod:`.routing`), and the wire form of Events (:mod:`.events`).
May import: the AgentJob read model and the shared pure modules.
"""
