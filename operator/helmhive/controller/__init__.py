"""The operator's I/O layer: thin Kopf handlers that fetch, call the pure core, and apply.

Owns: Kopf registration, the operator's door to the Kubernetes API (:mod:`helmhive.controller.kube.door`,
the only module here that imports the ``kubernetes`` client), and ``ensure_*``/``patch_*`` steps.
"""
