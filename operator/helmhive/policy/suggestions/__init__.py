"""Policy suggestions, pure: from a job's output to ready MemoryRecord files, and the export's audit record.

Owns: reading a ``policy-suggestion`` job's suggestions, their digests, the MemoryRecord each one
becomes (its source the job) and the file it is written as (:mod:`.export`); the SuggestionExport
request and the ``SuggestionsExported`` AuditRecord built from it (:mod:`.audit`).
Applies nothing and reads no cluster: a suggestion becomes memory only when a human commits its
file and it is applied like any other MemoryRecord.
May import: validation (each record is checked as ``helmhive validate`` checks it), audit and the
shared pure modules.
"""
