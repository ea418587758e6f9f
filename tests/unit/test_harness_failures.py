"""When the harness cannot get a cluster, tests FAIL with the reason; they are never skipped.

Each case runs an inner pytest session (``pytester``) with the harness plugin.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helmhive.devcluster.build import DEFAULT_ETCD_VERSION, DEFAULT_KUBE_VERSION

TESTS_DIR = Path(__file__).resolve().parents[1]


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    pytester.makeconftest('pytest_plugins = ["harness.plugin"]\n')
    pytester.makepyfile(test_inner="def test_needs_cluster(cluster):\n    pass\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delenv("HELMHIVE_TEST_KUBECONFIG", raising=False)
    monkeypatch.setenv("TMPDIR", str(pytester.path))  # the harness keeps a failed start's state there
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p no:pytest-kind")  # as pyproject.toml's addopts do
    return pytester


def _fake_stamped_cache(root: Path, etcd_message: str) -> None:
    """A cache whose stamped 'binaries' are scripts; etcd prints ``etcd_message`` and exits."""
    etcd_dir = root / "etcd" / DEFAULT_ETCD_VERSION
    kube_dir = root / "k8s" / DEFAULT_KUBE_VERSION
    for directory, names in (
        (etcd_dir, ["etcd"]),
        (kube_dir, ["kube-apiserver", "kube-controller-manager", "kubectl"]),
    ):
        directory.mkdir(parents=True)
        for name in names:
            script = directory / name
            script.write_text(f"#!/bin/sh\necho '{etcd_message}' >&2\nexit 2\n", encoding="utf-8")
            script.chmod(0o755)
        (directory / ".complete.json").write_text(json.dumps({"build_seconds": 0}), encoding="utf-8")


def test_kind_without_docker_fails_with_a_clear_message(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(inner.path / "no-such-bin"))
    result = inner.runpytest_subprocess("--kind", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*--kind: the kind cluster could not be made: missing docker.io*install them first*"])
    assert "SKIPPED" not in result.stdout.str()


def test_missing_kubeconfig_fails(inner: pytest.Pytester) -> None:
    result = inner.runpytest_subprocess("--kubeconfig", str(inner.path / "absent.kubeconfig"))
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*absent.kubeconfig, which does not exist*"])


def test_control_plane_start_failure_fails_with_the_log_tail(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _fake_stamped_cache(tmp_path / "cache", "fake etcd: data dir is locked")
    monkeypatch.setenv("HELMHIVE_CACHE_DIR", str(tmp_path / "cache"))
    result = inner.runpytest_subprocess()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "*the local control plane did not start*etcd exited before it was ready*",
            "*fake etcd: data dir is locked*",
        ]
    )


def test_build_failure_fails_with_the_reason(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HELMHIVE_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "no-go-here"))
    result = inner.runpytest_subprocess()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*could not build the control-plane binaries*`go` is not on PATH*"])
