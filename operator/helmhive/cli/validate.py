"""Placeholder for ``helmhive validate PATH...`` (offline manifest validation)."""

from __future__ import annotations

import typer


def run() -> None:
    """Validate manifests offline (not implemented yet)."""
    raise typer.Exit(2)
