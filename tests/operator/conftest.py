"""Operator fixtures for this directory (see :mod:`harness.operator`)."""

from harness.operator import helmhive_install, operator, operator_factory

__all__ = ["helmhive_install", "operator", "operator_factory"]
