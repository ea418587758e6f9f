"""Helmhive: a Kubernetes operator that governs AI coding-agent work declaratively.

The package has two source roots: ``operator/helmhive`` (API, pure policy core,
controller, CLI) and ``runner/helmhive/runner`` (the runner program). In a wheel they
are one directory; in a source checkout the line below joins them.
"""

from pkgutil import extend_path

__path__[:] = extend_path(__path__, __name__)
