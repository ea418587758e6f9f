"""Fixtures for the fuzz tests: the real operator (its admission webhook refuses widening profiles)."""

from harness.operator import helmhive_install, operator

__all__ = ["helmhive_install", "operator"]
