"""Memory, pure: which approved records a job is told, a record's ``Active`` condition, and the injected record.

Owns: selection and effect (:mod:`.selection`), the ``Active`` condition with its Workspace
(:mod:`.status`), and the ``MemoryInjected`` audit record (:mod:`.injected`).
May import: envelopes, audit names and the shared pure modules.
"""
