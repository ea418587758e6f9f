"""Session continuity, pure: which binding a job uses, resets and their audit, compaction of resumed chains.

Owns: :mod:`.continuity` (fresh, resume or fork), :mod:`.audit` (reset records) and
:mod:`.compaction` (when and how a chain is compacted). May import: audit and the shared pure modules.
"""
