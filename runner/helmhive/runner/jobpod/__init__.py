"""Job pods (``RunnerPool.spec.execution.mode: JobPod``): the link between a runner and a job's own pod.

- :mod:`~helmhive.runner.jobpod.frames`: the framed protocol (frame types, payload models, ``LinkError``).
- :mod:`~helmhive.runner.jobpod.auth`: mutual authentication with the pool's link key, and the pod's claim.
- :mod:`~helmhive.runner.jobpod.trees`: trees as tar streams, extracted safely; the shim's private copy.
- :mod:`~helmhive.runner.jobpod.shim`: ``helmhive-jobpod shim``, the trusted end in the pod.
- :mod:`~helmhive.runner.jobpod.launcher`: ``helmhive-jobpod agent``, the agent container's PID 1.
- :mod:`~helmhive.runner.jobpod.checks`: the shim's checks, sandboxed like the runner's.
- :mod:`~helmhive.runner.jobpod.relay`: the shim's egress relay to the runner's proxy.
- :mod:`~helmhive.runner.jobpod.link`: the runner's client (:class:`JobPodLink`).
- :mod:`~helmhive.runner.jobpod.bridge`: ``helmhive-jobpod attach``, the agent's local stand-in.

The fixed names, ports and paths are :mod:`helmhive.api.jobpod`'s.
"""
