"""Fixtures of the chart tests: a real ``helm`` (built from the Go module proxy, cached) and a
control plane of their own for installs (Helm will not adopt the objects the session's harness
creates). Helpers for calling helm live in ``chart_rig``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from helmhive.devcluster import cluster as devcluster
from helmhive.devcluster.build import BuildError, ensure_binaries
from helmhive.devcluster.helm import ensure_helm


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``helm`` binary; the first run builds it (a few minutes), later runs reuse the cache."""
    log_path = tmp_path_factory.mktemp("helm") / "build.log"
    with log_path.open("w", encoding="utf-8") as log:
        try:
            return ensure_helm(log=log)
        except BuildError as err:
            pytest.fail(f"{err}\n{log_path.read_text()[-4000:]}", pytrace=False)


@pytest.fixture(scope="module")
def fresh_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[devcluster.ClusterInfo]:
    """A local control plane (etcd, kube-apiserver, kube-controller-manager; no kubelet) for one module."""
    workdir = tmp_path_factory.mktemp("chart-cluster")
    with (workdir / "build.log").open("w", encoding="utf-8") as log:
        binaries = ensure_binaries(log=log)
    try:
        info = devcluster.start(binaries, workdir / "state", tie_to_parent=True)
    except devcluster.ClusterError as err:
        pytest.fail(f"the chart tests' control plane did not start: {err}", pytrace=False)
    try:
        yield info
    finally:
        devcluster.stop(workdir / "state")
