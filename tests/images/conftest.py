"""The operator's install fixture for this directory (see :mod:`harness.operator`)."""

from harness.operator import helmhive_install

__all__ = ["helmhive_install"]
