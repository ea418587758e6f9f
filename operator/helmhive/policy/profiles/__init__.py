"""Profiles, pure: narrowing to an envelope, every reason a profile cannot be, and its revisions.

Owns: :mod:`.narrowing` (the effective profile), :mod:`.checks` (each violation with its field
path) and :mod:`.revisions` (content hashes, immutable snapshots, pruning).
May import: envelopes and violations only.
"""
