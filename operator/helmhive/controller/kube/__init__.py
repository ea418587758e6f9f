"""The operator's one door to the Kubernetes API: the client calls, plain JSON on the loop, watch streams.

Owns: :class:`~helmhive.controller.kube.door.Kube` and its JSON requests (:mod:`.jsonapi`,
:mod:`.http`), watch streams (:mod:`.watch`), reads shared by concurrent callers
(:mod:`.shared_reads`), the contact probe (:mod:`.contact`), and the hook it reports each write
through (:mod:`.hooks`).
May import: the pure API (models, the error tree) and :mod:`helmhive.kubeclient`. Must not:
import any handler, the router, the runtime or the metrics (an import-linter contract keeps it so).
"""
