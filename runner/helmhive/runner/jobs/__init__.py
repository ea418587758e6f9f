"""The job's life on the runner: one AgentJob from its context to its result, with its writes and journal.

Owns: the work items (:mod:`.work`), a job's context and session (:mod:`.context`,
:mod:`.session`), the adapters built for it (:mod:`.agents`), its execution and status writes
(:mod:`.execution`, :mod:`.writes`, :mod:`.status`), what it holds (:mod:`.resources`), its
result (:mod:`.result`), the journal, and governed work (:mod:`.governed`).
May import: sessions, source, egress, sandbox, the door and the shared modules. Must not:
import the program, which drives it.
"""
