"""The ``helmhive.dev/v1alpha1`` API as pydantic models: the single source of truth.

Owns: the models of every kind, condition types and reason names, and the CRD generator.
Must not: import kopf, kubernetes or httpx, or do any I/O.
"""
