"""Fixtures of the chart tests: a real ``helm`` (built from the Go module proxy, cached) and a
control plane of their own for installs (Helm will not adopt the objects the session's harness
creates). Helpers for calling helm live in ``chart_rig``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.helm import helm_binary
from helmhive.devcluster import cluster as devcluster
from helmhive.devcluster.build import ensure_binaries


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``helm`` binary (built once from the Go module proxy, then cached)."""
    return helm_binary(tmp_path_factory)


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
