"""The installed helmhive version, as reported by runners, adapters and the reference agent."""

from __future__ import annotations

from importlib import metadata

_FALLBACK = "0.0.0+unknown"


def helmhive_version() -> str:
    """Return the version of the installed ``helmhive`` distribution."""
    try:
        return metadata.version("helmhive")
    except metadata.PackageNotFoundError:
        return _FALLBACK
