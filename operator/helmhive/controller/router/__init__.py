"""The routing engine: one decision per queued job, written once, audited in batches, woken by freed capacity.

Owns: :class:`~helmhive.controller.router.engine.Router` and its Kopf side
(:mod:`.handlers`), its work queue, indexes, capacity, Events, audit
batches and their recovery after a restart, its settings, and the scrape-time gauges it
registers with the metrics (:mod:`.gauges`).
May import: the runtime, the door, the metrics, the audit writer and the pure core. Must not:
import the queue step (:mod:`helmhive.controller.jobs`), which hands jobs to it.
"""
