"""Pure tests of the wrapper-module helpers that build the control-plane binaries."""

from __future__ import annotations

import shlex

import pytest

from helmhive.devcluster.gomod import (
    build_etcd_wrapper_gomod,
    build_kube_ldflags,
    build_kube_wrapper_gomod,
    decide_staging_modules,
    parse_kube_release,
)

# Shaped like k8s.io/kubernetes' own go.mod: generated header, godebug, two require
# blocks (direct and indirect), pseudo-versions of non-staging k8s.io modules, a
# single-line require, and the replace block that only holds inside k/k's tree.
KUBE_GOMOD = """\
// This is a generated file. Do not edit directly.
// Run hack/pin-dependency.sh to change pinned dependency versions.

module k8s.io/kubernetes

go 1.25.0

godebug default=go1.25

require (
\tbitbucket.org/bertimus9/systemstat v0.5.0
\tgithub.com/JeffAshton/win_pdh v0.0.0-20161109143554-76bb4ee9f0ab
\tgithub.com/spf13/cobra v1.10.0
\tgo.etcd.io/etcd/client/v3 v3.6.4
\tk8s.io/api v0.0.0
\tk8s.io/apiextensions-apiserver v0.0.0
\tk8s.io/apimachinery v0.0.0
\tk8s.io/apiserver v0.0.0
\tk8s.io/client-go v0.0.0
\tk8s.io/component-base v0.0.0
\tk8s.io/klog/v2 v2.130.1
\tk8s.io/kube-aggregator v0.0.0
\tk8s.io/kube-openapi v0.0.0-20250910181357-589584f1c912
\tk8s.io/utils v0.0.0-20250820121507-0af2bda4dd1d
\tsigs.k8s.io/yaml v1.6.0
)

require (
\tgithub.com/beorn7/perks v1.0.1 // indirect
\tk8s.io/cri-client v0.0.0 // indirect
\tk8s.io/kms v0.0.0 // indirect
)

require k8s.io/sample-apiserver v0.0.0

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/apiextensions-apiserver => ./staging/src/k8s.io/apiextensions-apiserver
\tk8s.io/apimachinery => ./staging/src/k8s.io/apimachinery
\tk8s.io/code-generator v0.0.0 => ./staging/src/k8s.io/code-generator
\tk8s.io/only-replaced => ./staging/src/k8s.io/only-replaced
)

replace k8s.io/single-line-replaced v0.0.0 => ./staging/src/k8s.io/single-line-replaced
"""

STAGING = [
    "k8s.io/api",
    "k8s.io/apiextensions-apiserver",
    "k8s.io/apimachinery",
    "k8s.io/apiserver",
    "k8s.io/client-go",
    "k8s.io/component-base",
    "k8s.io/cri-client",
    "k8s.io/kms",
    "k8s.io/kube-aggregator",
    "k8s.io/sample-apiserver",
]


def test_staging_modules_are_the_v0_0_0_requires_only() -> None:
    assert decide_staging_modules(KUBE_GOMOD) == STAGING


def test_replace_directives_and_staging_paths_are_ignored() -> None:
    found = decide_staging_modules(KUBE_GOMOD)
    assert "k8s.io/code-generator" not in found  # only in a replace, with a version
    assert "k8s.io/only-replaced" not in found
    assert "k8s.io/single-line-replaced" not in found
    assert not any("staging" in module or "=>" in module for module in found)


def test_pseudo_versions_and_real_versions_are_not_staging() -> None:
    found = decide_staging_modules(KUBE_GOMOD)
    assert "k8s.io/kube-openapi" not in found
    assert "k8s.io/utils" not in found
    assert "k8s.io/klog/v2" not in found


def test_a_gomod_without_staging_modules_is_refused() -> None:
    with pytest.raises(ValueError, match="no staging modules"):
        decide_staging_modules("module example.com/x\n\nrequire k8s.io/klog/v2 v2.130.1\n")


def test_wrapper_gomod_pins_each_staging_module_to_the_release() -> None:
    release = parse_kube_release("v1.37.2")
    wrapper = build_kube_wrapper_gomod(release=release, kube_gomod=KUBE_GOMOD, go_version="1.26.0")
    lines = wrapper.splitlines()
    assert "require k8s.io/kubernetes v1.37.2" in lines
    assert "go 1.26.0" in lines
    replaces = [line.strip() for line in lines if "=>" in line]
    assert replaces == [f"{module} => {module} v0.37.2" for module in STAGING]
    assert "./staging" not in wrapper


def test_ldflags_stamp_the_version_for_server_and_client() -> None:
    release = parse_kube_release("v1.37.2")
    flags = shlex.split(build_kube_ldflags(release=release, build_date="2026-01-02T03:04:05Z"))
    assert flags[:2] == ["-s", "-w"]
    assignments = {flags[i + 1] for i, flag in enumerate(flags) if flag == "-X"}
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        assert f"{pkg}.gitVersion=v1.37.2" in assignments
        assert f"{pkg}.gitMajor=1" in assignments
        assert f"{pkg}.gitMinor=37" in assignments
        assert f"{pkg}.gitTreeState=clean" in assignments
        assert f"{pkg}.buildDate=2026-01-02T03:04:05Z" in assignments
    assert len(assignments) == 10


@pytest.mark.parametrize("version", ["1.37.2", "v1.37", "v1.37.2-rc.0", "v2.0.0", "v1.37.2 "])
def test_only_plain_releases_are_accepted(version: str) -> None:
    with pytest.raises(ValueError):
        parse_kube_release(version)


def test_release_maps_to_the_staging_version() -> None:
    release = parse_kube_release("v1.37.2")
    assert (release.minor, release.patch, release.staging_version) == (37, 2, "v0.37.2")


def test_etcd_wrapper_accepts_only_3_5_and_3_6() -> None:
    gomod = build_etcd_wrapper_gomod(etcd_version="v3.6.16", go_version="1.26.0")
    assert "require go.etcd.io/etcd/server/v3 v3.6.16" in gomod.splitlines()
    with pytest.raises(ValueError):
        build_etcd_wrapper_gomod(etcd_version="v3.4.30", go_version="1.26.0")
