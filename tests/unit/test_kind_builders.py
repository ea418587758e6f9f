"""The pure parts of the kind cluster: the capability check, kind's config, kube-router's manifests,
component Dockerfiles, input digests, the node base's pin, demo objects and progress lines."""

from __future__ import annotations

import io
import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from helmhive.api.execution import ExecutionMode, decide_execution_problems
from helmhive.api.runnerpool import RunnerPoolSpec
from helmhive.devcluster.demo import example_documents
from helmhive.devcluster.demo_manifests import build_change_documents, build_demo_documents
from helmhive.devcluster.kind.cluster import build_kind_config
from helmhive.devcluster.kind.demo_objects import (
    build_git_egress,
    build_git_server,
    git_url,
    in_job_pods,
    with_runner_image,
    without_runners,
)
from helmhive.devcluster.kind.engine import WRAPPER, decide_needs_cap_wrapper
from helmhive.devcluster.kind.helmhive_images import build_unique_tag, decide_node_base
from helmhive.devcluster.kind.images import ImageError, build_component_dockerfile, digest_inputs
from helmhive.devcluster.kind.network import build_cni_conflist, build_kube_router_manifests
from helmhive.devcluster.kind.node import etcd_image_tag
from helmhive.devcluster.progress import step

_FULL = "CapBnd:\t000001ffffffffff\n"
_NO_SYS_RESOURCE = "CapInh:\t0000000000000000\nCapBnd:\t000001fffeffffff\n"


def test_the_wrapper_is_needed_only_where_cap_sys_resource_is_missing() -> None:
    assert decide_needs_cap_wrapper(_NO_SYS_RESOURCE) is True
    assert decide_needs_cap_wrapper(_FULL) is False
    assert decide_needs_cap_wrapper("Name:\tpython\n") is False


def test_the_wrapper_drops_only_cap_sys_resource_from_a_bundle(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    caps = ["CAP_CHOWN", "CAP_SYS_RESOURCE", "CAP_NET_ADMIN"]
    spec = {"process": {"capabilities": {k: list(caps) for k in ("bounding", "effective", "permitted")}}}
    (bundle / "config.json").write_text(json.dumps(spec))
    fake_runc = tmp_path / "runc"
    fake_runc.write_text('#!/bin/sh\necho runc "$@"\n')
    fake_runc.chmod(0o755)
    wrapper = tmp_path / "wrapper"
    wrapper.write_text(WRAPPER.replace("RUNC, [RUNC]", f"{str(fake_runc)!r}, [{str(fake_runc)!r}]"))
    wrapper.chmod(0o755)

    out = subprocess.run(
        [str(wrapper), "--root", "/x", "create", "--bundle", str(bundle), "id1"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == f"runc --root /x create --bundle {bundle} id1"
    written = json.loads((bundle / "config.json").read_text())
    for names in written["process"]["capabilities"].values():
        assert names == ["CAP_CHOWN", "CAP_NET_ADMIN"]


def test_kind_config_has_workers_no_default_cni_and_allows_cgroup_v1() -> None:
    config = yaml.safe_load(build_kind_config(workers=1, etcd_image_tag="3.6.16-0"))
    assert [n["role"] for n in config["nodes"]] == ["control-plane", "worker"]
    assert config["networking"]["disableDefaultCNI"] is True
    patches = [yaml.safe_load(p) for p in config["kubeadmConfigPatches"]]
    assert {"kind": "KubeletConfiguration", "failCgroupV1": False} in patches
    assert {"kind": "ClusterConfiguration", "etcd": {"local": {"imageTag": "3.6.16-0"}}} in patches
    assert len(yaml.safe_load(build_kind_config(workers=3, etcd_image_tag="x"))["nodes"]) == 4


def test_kube_router_routes_and_polices_but_leaves_services_to_kube_proxy() -> None:
    docs = build_kube_router_manifests("local/kube-router:v2")
    kinds = [d["kind"] for d in docs]
    assert kinds == ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet"]
    pod = docs[-1]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert {"--run-router=true", "--run-firewall=true", "--run-service-proxy=false"} <= set(container["args"])
    assert container["image"] == "local/kube-router:v2" and container["imagePullPolicy"] == "Never"
    assert pod["hostNetwork"] is True and pod["tolerations"] == [{"operator": "Exists"}]
    rules = docs[1]["rules"]
    assert any("networkpolicies" in r["resources"] for r in rules)
    conflist = json.loads(build_cni_conflist())
    assert conflist["plugins"][0]["type"] == "bridge" and "subnet" not in conflist["plugins"][0]["ipam"]


def test_component_dockerfiles_and_digests() -> None:
    text = build_component_dockerfile(base="scratch", binary="/x/pause", entrypoint="/pause")
    assert text == 'FROM scratch\nCOPY pause /pause\nENTRYPOINT ["/pause"]\n'
    with_packages = build_component_dockerfile(base="deb", binary="kube-proxy", entrypoint="/k", packages=("iptables",))
    assert "apt-get install -y --no-install-recommends iptables" in with_packages
    assert digest_inputs("a", "b") == digest_inputs("a", "b")
    assert digest_inputs("a", "b") != digest_inputs("ab")
    assert etcd_image_tag("v3.6.16") == "3.6.16-0"


def test_demo_objects_use_the_local_image_and_open_only_git() -> None:
    docs = [{"kind": "RunnerPool", "spec": {"image": "x", "adapter": {"type": "acp", "acp": {"command": "c"}}}}]
    out = with_runner_image(docs, "local/runner:dev", env=[{"name": "A", "value": "1"}])
    assert out[0]["spec"]["image"] == "local/runner:dev" and out[0]["spec"]["imagePullPolicy"] == "Never"
    assert out[0]["spec"]["adapter"]["acp"]["env"] == [{"name": "A", "value": "1"}]
    assert docs[0]["spec"]["image"] == "x", "the input is not changed"
    pod, service = build_git_server("local/runner:dev")
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert service["spec"]["ports"][0]["port"] == 9418
    egress = build_git_egress("git-ns")["spec"]["egress"]
    assert egress[0]["ports"] == [{"protocol": "TCP", "port": 9418}]
    assert git_url("git-ns") == "git://git.git-ns.svc.cluster.local/shop.git"


def test_demo_pools_in_job_pods_are_valid_pools_with_a_warm_pod() -> None:
    docs = build_demo_documents() + build_change_documents(repository="git://git/shop.git", commit="0" * 40)
    out = in_job_pods(docs)
    pools = [RunnerPoolSpec.model_validate(d["spec"]) for d in out if d["kind"] == "RunnerPool"]
    assert len(pools) == 2
    for spec in pools:
        assert spec.execution.mode is ExecutionMode.JOB_POD and spec.execution.warm_pods == 1
        assert spec.job_limits.cpu_millicores == 250
        isolation = spec.credential_isolation
        assert isolation is not None and decide_execution_problems(execution=spec.execution, isolation=isolation) == []
    assert all("execution" not in d["spec"] for d in docs if d["kind"] == "RunnerPool"), "the input is not changed"


def test_the_examples_pools_stay_valid_and_run_no_pods_in_the_kind_demo() -> None:
    docs = [doc for _, doc in example_documents()]
    out = without_runners(docs)
    pools = [d for d in out if d["kind"] == "RunnerPool"]
    assert pools, "the examples hold RunnerPools"
    for doc in pools:
        assert RunnerPoolSpec.model_validate(doc["spec"]).replicas == 0
    before = [d["spec"]["replicas"] for d in docs if d["kind"] == "RunnerPool"]
    assert any(n > 0 for n in before), "the input is not changed"
    assert [d for d in out if d["kind"] != "RunnerPool"] == [d for d in docs if d["kind"] != "RunnerPool"]


def test_a_long_step_says_so_while_it_runs() -> None:
    out = io.StringIO()
    with step(out, "building kubelet", every=0.05):
        deadline = time.monotonic() + 5
        while "still building kubelet" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
    lines = out.getvalue().splitlines()
    assert lines[0] == "building kubelet …"
    assert any(line.startswith("  … still building kubelet (") for line in lines)
    assert lines[-1].startswith("done: building kubelet (")
    assert not [t for t in threading.enumerate() if t.name.startswith("progress:")]


def test_a_failed_step_says_failed() -> None:
    out = io.StringIO()
    with pytest.raises(RuntimeError), step(out, "x"):
        raise RuntimeError("boom")
    assert out.getvalue().splitlines()[-1].startswith("failed: x (")


def test_the_node_base_is_read_from_an_exact_node_image_pin() -> None:
    text = "ARG DEBIAN_IMAGE=debian:12.15-slim\nARG NODE_IMAGE=node:22.23.5-bookworm-slim\nFROM ${NODE_IMAGE}\n"
    assert decide_node_base(text) == ("node:22.23.5-bookworm-slim", "22.23.5")
    for unpinned in ("ARG NODE_IMAGE=node:22-bookworm-slim\n", "ARG NODE_IMAGE=node:lts\n", "FROM node\n"):
        with pytest.raises(ImageError, match="NODE_IMAGE"):
            decide_node_base(unpinned)


def test_a_rebuilt_image_gets_a_tag_of_its_own() -> None:
    first = build_unique_tag("helmhive.local/helmhive:dev", "sha256:" + "ab" * 32)
    assert first == "helmhive.local/helmhive:dev-abababababab"
    assert build_unique_tag("helmhive.local/helmhive:dev", "sha256:" + "cd" * 32) != first
    repository, tag = first.rsplit(":", 1)  # what helm is given: repository and tag apart
    assert (repository, tag) == ("helmhive.local/helmhive", "dev-abababababab")
