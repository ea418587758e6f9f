"""The runner program as a process: main loop, control state, registration, heartbeat and report.

Owns: the process (:mod:`.process`, :mod:`.main`), the control state and its loop
(:mod:`.control`, :mod:`.control_loop`), registration, the Lease (:mod:`.heartbeat`), the
report (:mod:`.report`, :mod:`.reporting`), and the cluster's job source (:mod:`.cluster_jobs`).
May import: everything else of the runner; nothing imports it.
"""
