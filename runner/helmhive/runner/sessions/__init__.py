"""The runner's side of session continuity: its sessions Secret, its SessionBindings, compaction.

Owns: :mod:`.bindings` (the Secret holding native session ids, never written anywhere else,
and the bindings' status) and :mod:`.compaction`. May import: the door, the sandbox, adapters.
"""
