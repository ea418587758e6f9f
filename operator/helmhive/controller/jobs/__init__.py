"""AgentJobs on the operator's side: queue time, the operator's own watch, and the jobs whose runner failed or was lost.

Owns: binding a job's profile revision at queue time (:mod:`.binding`, :mod:`.queueing`), the
AgentJob informer (:mod:`.watch`), re-queueing after an infrastructure failure (:mod:`.failed`)
and after a lost runner (:mod:`.lost`).
May import: the router (to hand a bound job over and to finish its audit), the runtime, the
door, the metrics and the pure core. Must not: be imported by the router or the door.
"""
