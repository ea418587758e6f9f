"""The job's life on the runner: one AgentJob from its context to its result, with its writes and journal.

Owns: the work items (:mod:`.work`), a job's context and session (:mod:`.context`,
:mod:`.session`), the adapters built for it (:mod:`.agents`), its execution and status writes
(:mod:`.execution`, :mod:`.conversation`, :mod:`.writes`, :mod:`.status`), what it holds
(:mod:`.resources`), its result (:mod:`.result`), the journal, governed work (:mod:`.governed`),
and a job pod's run (``execution.mode: JobPod``: :mod:`.podsteps`, :mod:`.podclaim`, :mod:`.jobpod`).
May import: sessions, source, egress, sandbox, the job pod link (:mod:`helmhive.runner.jobpod`),
the door and the shared modules. Must not: import the program, which drives it.
"""
