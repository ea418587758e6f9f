"""Job pods, pure: the objects a RunnerPool in ``execution.mode: JobPod`` needs, and the decisions about them.

Owns: who a job pod belongs to and the labels that select it (:mod:`.identity`), the job pod and the
patch that claims a warm one (:mod:`.pod`), the NetworkPolicy of the
pool's job pods and the rules the runner pods' policy adds for them (:mod:`.network`), the pool's
link-key Secret (:mod:`.link`), the typed view of a pod the decisions read (:mod:`.view`), the
warm set's plan (:mod:`.warmset`) and what a pod's state means for its job (:mod:`.outcome`).
The fixed contract they follow (names, ports, paths, labels) is :mod:`helmhive.api.jobpod`.

Must not: do I/O, read the clock or draw random bytes (``now`` and the link key are the caller's).
May import: timestamps and the api; not runners, whose pool builders import :mod:`.network` (the runner
pods' rules for their job pods).
"""
