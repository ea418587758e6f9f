"""Operator fixtures for this directory (see :mod:`harness.operator`)."""

from change_rig import rig
from reference_pool import start_reference_pod

from harness.operator import helmhive_install, operator, operator_factory

__all__ = ["helmhive_install", "operator", "operator_factory", "rig", "start_reference_pod"]
