"""The e2e tier: Helmhive installed with Helm on a two-node kind cluster, with no stand-in anywhere.

The session builds (or reuses from the cache) the node image, kind, kubectl, kube-router and
Helmhive's own images (``docker build``), creates a kind cluster through pytest-kind, loads the
images with ``kind load``, and installs the chart with ``helm install`` once. The modules then run
in name order against that release; the last one upgrades and uninstalls it.

Run it with ``pytest tests/e2e`` (``make test`` does, after the other tiers). Each xdist worker
would make a cluster of its own, so the Makefile runs this tier in one process.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_rig import CHART, RELEASE, RUNNERS_NS, SYSTEM_NS, Rig, reference_documents

from harness.helm import helm_binary
from harness.kind import KindEnv, kind_cluster
from helmhive.devcluster.build import BuildError
from helmhive.devcluster.kind.cluster import KindError
from helmhive.devcluster.kind.engine import EngineError


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The first test pays for the session's cluster (and, if `helmhive dev kind build` did not run
    # first, for cold builds of the node image and tools): give every e2e test room for that.
    for item in items:
        if item.path.parent == Path(__file__).parent:
            item.add_marker(pytest.mark.timeout(3600))


@pytest.fixture(scope="session")
def kind_env(request: pytest.FixtureRequest) -> Iterator[KindEnv]:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    name = "helmhive-e2e" + (f"-{worker}" if worker else "")
    capture = request.config.pluginmanager.getplugin("capturemanager")
    try:
        # Progress lines of the builds and of cluster creation reach the terminal as they happen.
        with capture.global_and_fixture_disabled():
            context = kind_cluster(name)
            env = context.__enter__()
    except (BuildError, EngineError, KindError) as err:
        pytest.fail(f"the e2e kind cluster could not be made: {err}", pytrace=False)
    try:
        yield env
    finally:
        context.__exit__(*sys.exc_info())


@pytest.fixture(scope="session")
def helm_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``helm`` binary (built once from the Go module proxy, then cached)."""
    return helm_binary(tmp_path_factory)


@pytest.fixture(scope="session")
def rig(kind_env: KindEnv, helm_bin: Path) -> Rig:
    """The release, installed once per session: two operator replicas from the local image."""
    rig = Rig(env=kind_env, helm_bin=helm_bin)
    # The pod networks, as a platform team sets them: the runners' HTTPS egress excepts them.
    pod_cidrs = sorted({n["spec"]["podCIDR"] for n in rig.get("nodes")["items"]})
    rig.helm(
        "upgrade", "--install", RELEASE, CHART, "-n", SYSTEM_NS, "--create-namespace",
        *rig.install_values(), "--set", "operator.replicas=2",
        "--set-json", f"runnerNetworkPolicy.clusterCIDRs={json.dumps(pod_cidrs)}",
        "--wait", "--timeout", "5m",
    )  # fmt: skip
    return rig


@pytest.fixture(scope="session")
def runners(rig: Rig) -> Rig:
    rig.kubectl("create", "namespace", RUNNERS_NS)
    rig.kubectl(
        "label", "namespace", RUNNERS_NS,
        "pod-security.kubernetes.io/enforce=restricted", "pod-security.kubernetes.io/enforce-version=latest",
        "helmhive.dev/workspaces=enabled",
    )  # fmt: skip
    # Everything at once, in one apply: the job before its runner exists, as GitOps tools do.
    rig.apply(reference_documents(rig), RUNNERS_NS)
    return rig
