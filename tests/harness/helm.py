"""The real ``helm`` for the tests that install the chart: built from the Go module proxy once, cached."""

from __future__ import annotations

from pathlib import Path

import pytest

from helmhive.devcluster.build import BuildError
from helmhive.devcluster.helm import ensure_helm

__all__ = ["helm_binary"]


def helm_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``helm`` binary; the first run builds it (a few minutes), later runs reuse the cache."""
    log_path = tmp_path_factory.mktemp("helm") / "build.log"
    with log_path.open("w", encoding="utf-8") as log:
        try:
            return ensure_helm(log=log)
        except BuildError as err:
            pytest.fail(f"{err}\n{log_path.read_text()[-4000:]}", pytrace=False)
