"""A RunnerPool's NetworkPolicy and the operator's cluster CIDRs: what HTTPS egress excepts.

Empty, the policy is the one pools always had (HTTPS to any address). Set, the HTTPS rule goes
to every address of each listed family except the cluster's pod networks; DNS stays open. The
setting is parsed once, at start-up, and a bad value stops the operator with one plain line.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from typing import Any

import pytest
from typer.testing import CliRunner

from helmhive.api.runnerpool import RunnerPoolSpec
from helmhive.cli.main import app
from helmhive.controller.runners.pools import PoolLoop
from helmhive.controller.runtime import OperatorConfig, Runtime
from helmhive.policy.runners.credentials import CredentialDecision
from helmhive.policy.runners.pool import (
    MAX_CLUSTER_CIDRS,
    ClusterCidrError,
    ClusterNetwork,
    PoolRef,
    build_network_policy,
    build_pool_objects,
    parse_cluster_cidrs,
)

POOL = PoolRef(name="claude", namespace="team-a", uid="0b9e6a4e-0000-4000-8000-000000000001")
SPEC = RunnerPoolSpec.model_validate(
    {
        "provider": "anthropic",
        "adapter": {"type": "claude-cli", "claudeCli": {"path": "claude"}},
        "image": "ghcr.io/helmhive/runner:0.1.0",
        "credential": {"secretRef": {"name": "anthropic-key", "key": "api-key"}, "envName": "ANTHROPIC_API_KEY"},
        "replicas": 1,
    }
)
DNS_RULE = {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}
HTTPS_PORTS = [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}]
runner = CliRunner()


def networks(*cidrs: str) -> tuple[ClusterNetwork, ...]:
    return tuple(ipaddress.ip_network(c) for c in cidrs)


def egress(policy: dict[str, Any]) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = policy["spec"]["egress"]
    return rules


# The policy --------------------------------------------------------------------------------------
def test_without_cluster_cidrs_the_policy_is_unchanged() -> None:
    policy = build_network_policy(POOL)
    assert policy == build_network_policy(POOL, cluster_cidrs=())
    assert policy["spec"] == {
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "helmhive-runner", "helmhive.dev/pool": "claude"}},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [],
        "egress": [DNS_RULE, {"ports": HTTPS_PORTS}],
    }
    assert policy["metadata"]["name"] == "helmhive-runner-claude"


@pytest.mark.parametrize(
    ("cidrs", "destinations"),
    [
        pytest.param(
            ("10.244.0.0/16",),
            [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.244.0.0/16"]}}],
            id="ipv4",
        ),
        pytest.param(
            ("10.244.0.0/16", "fd00:10:244::/56", "10.245.0.0/16"),
            [
                {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.244.0.0/16", "10.245.0.0/16"]}},
                {"ipBlock": {"cidr": "::/0", "except": ["fd00:10:244::/56"]}},
            ],
            id="dual-stack",
        ),
        pytest.param(
            ("fd00:10:244::/56",),
            [{"ipBlock": {"cidr": "::/0", "except": ["fd00:10:244::/56"]}}],
            id="ipv6-only-no-ipv4-https",
        ),
    ],
)
def test_cluster_cidrs_are_excepted_from_https_and_dns_stays_open(
    cidrs: tuple[str, ...], destinations: list[dict[str, Any]]
) -> None:
    policy = build_network_policy(POOL, cluster_cidrs=networks(*cidrs))
    assert egress(policy) == [DNS_RULE, {"to": destinations, "ports": HTTPS_PORTS}]
    assert policy["spec"]["ingress"] == []
    assert "to" not in egress(policy)[0], "DNS goes anywhere: the cluster's DNS is a pod"


def test_every_pool_object_but_the_policy_ignores_the_setting() -> None:
    plain = build_pool_objects(POOL, SPEC, credential_generation=1)
    fenced = build_pool_objects(POOL, SPEC, credential_generation=1, cluster_cidrs=networks("10.244.0.0/16"))
    assert [(o["kind"], o["metadata"]["name"]) for o in plain] == [(o["kind"], o["metadata"]["name"]) for o in fenced]
    for before, after in zip(plain, fenced, strict=True):
        if before["kind"] == "NetworkPolicy":
            assert after == build_network_policy(POOL, cluster_cidrs=networks("10.244.0.0/16"))
            assert before == build_network_policy(POOL)
        else:
            assert before == after, before["kind"]


def test_the_builder_does_not_share_its_port_lists() -> None:
    first = build_network_policy(POOL)
    egress(first)[1]["ports"].append({"protocol": "TCP", "port": 22})
    egress(first)[0]["ports"].clear()
    assert egress(build_network_policy(POOL)) == [DNS_RULE, {"ports": HTTPS_PORTS}]


# Parsing the setting -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("", (), id="empty"),
        pytest.param("  ", (), id="blank"),
        pytest.param("10.244.0.0/16", ("10.244.0.0/16",), id="one"),
        pytest.param(
            " 10.244.0.0/16 , FD00:10:244:0::/56", ("10.244.0.0/16", "fd00:10:244::/56"), id="spaces-and-canonical-v6"
        ),
        pytest.param("10.244.0.0/16,10.244.0.0/16,192.168.0.0/24", ("10.244.0.0/16", "192.168.0.0/24"), id="dup"),
        pytest.param("10.1.2.3/32", ("10.1.2.3/32",), id="one-address"),
    ],
)
def test_cluster_cidrs_parse_to_canonical_networks_in_order(text: str, expected: tuple[str, ...]) -> None:
    assert tuple(str(n) for n in parse_cluster_cidrs(text)) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("10.244.0.0", "'10.244.0.0' has no prefix length", id="bare-address"),
        pytest.param("10.244.0.1/16", "'10.244.0.1/16' has host bits set (its network is 10.244.0.0/16)", id="host"),
        pytest.param("10.244.0.0/33", "'10.244.0.0/33' is not an IPv4 or IPv6 CIDR", id="prefix-too-long"),
        pytest.param("010.0.0.0/8", "'010.0.0.0/8' is not an IPv4 or IPv6 CIDR", id="leading-zero"),
        pytest.param("pods/16", "'pods/16' is not an IPv4 or IPv6 CIDR", id="not-an-address"),
        pytest.param("0.0.0.0/0", "'0.0.0.0/0' is every address of its family", id="all-v4"),
        pytest.param("::/0", "'::/0' is every address of its family", id="all-v6"),
        pytest.param("10.244.0.0/16,,10.96.0.0/12", "entry 2 is empty", id="empty-entry"),
        pytest.param("10.244.0.0/16 10.96.0.0/12", "'10.244.0.0/16 10.96.0.0/12' is not", id="space-separated"),
    ],
)
def test_a_bad_cluster_cidr_is_refused_by_value(text: str, message: str) -> None:
    with pytest.raises(ClusterCidrError) as err:
        parse_cluster_cidrs(text)
    assert message in str(err.value)


def test_every_bad_cluster_cidr_is_reported_together() -> None:
    with pytest.raises(ClusterCidrError) as err:
        parse_cluster_cidrs("10.244.0.1/16,10.96.0.0/12,fd00::1/64,nope")
    assert str(err.value) == (
        "'10.244.0.1/16' has host bits set (its network is 10.244.0.0/16); "
        "'fd00::1/64' has host bits set (its network is fd00::/64); "
        "'nope' has no prefix length (write a network as address/prefix, e.g. 10.244.0.0/16)"
    )


def test_the_list_is_bounded() -> None:
    cidrs = [f"10.{i}.0.0/16" for i in range(MAX_CLUSTER_CIDRS)]
    assert len(parse_cluster_cidrs(",".join(cidrs))) == MAX_CLUSTER_CIDRS
    with pytest.raises(ClusterCidrError, match=f"{MAX_CLUSTER_CIDRS + 1} networks, at most {MAX_CLUSTER_CIDRS}"):
        parse_cluster_cidrs(",".join([*cidrs, "10.250.0.0/16"]))


# The operator's start-up -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "env"),
    [
        pytest.param(["--runner-cluster-cidrs=10.244.0.1/16"], {}, id="flag"),
        pytest.param([], {"HELMHIVE_RUNNER_CLUSTER_CIDRS": "10.244.0.1/16"}, id="env"),
    ],
)
def test_the_operator_refuses_to_start_with_a_bad_cidr(
    monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str]
) -> None:
    started: list[OperatorConfig] = []
    monkeypatch.setattr("helmhive.controller.app.run_operator", lambda **kw: started.append(kw["config"]))
    result = runner.invoke(app, ["operator", "run", *args], env=env)
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        "error: --runner-cluster-cidrs (HELMHIVE_RUNNER_CLUSTER_CIDRS): "
        "'10.244.0.1/16' has host bits set (its network is 10.244.0.0/16)\n"
    )
    assert "Traceback" not in result.output
    assert started == [], "fail closed: nothing runs"


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        pytest.param([], {}, (), id="unset"),
        pytest.param(
            ["--runner-cluster-cidrs=10.244.0.0/16,fd00:10:244::/56"],
            {},
            networks("10.244.0.0/16", "fd00:10:244::/56"),
            id="flag",
        ),
        pytest.param([], {"HELMHIVE_RUNNER_CLUSTER_CIDRS": "10.244.0.0/16"}, networks("10.244.0.0/16"), id="env"),
    ],
)
def test_the_setting_reaches_the_operators_config(
    monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str], expected: tuple[ClusterNetwork, ...]
) -> None:
    started: list[OperatorConfig] = []
    monkeypatch.setattr("helmhive.controller.app.run_operator", lambda **kw: started.append(kw["config"]))
    monkeypatch.delenv("HELMHIVE_RUNNER_CLUSTER_CIDRS", raising=False)
    result = runner.invoke(app, ["operator", "run", *args], env=env)
    assert result.exit_code == 0, result.output
    (config,) = started
    assert config.runner_cluster_cidrs == expected
    assert OperatorConfig().runner_cluster_cidrs == ()


# The pool loop applies what the setting says -----------------------------------------------------
class RecordingKube:
    """The operator's API wrapper, as far as applying a pool's objects goes."""

    def __init__(self) -> None:
        self.applied: list[dict[str, Any]] = []

    async def apply(self, obj: dict[str, Any]) -> None:
        self.applied.append(obj)

    async def delete_object(self, api_version: str, kind: str, name: str, namespace: str) -> None:
        pass


@pytest.mark.parametrize("cidrs", [pytest.param((), id="unset"), pytest.param(("10.244.0.0/16",), id="set")])
def test_the_pool_loop_applies_the_policy_of_the_operators_setting(cidrs: tuple[str, ...]) -> None:
    kube = RecordingKube()
    config = OperatorConfig(runner_cluster_cidrs=networks(*cidrs))
    loop = PoolLoop(
        runtime=Runtime(kube=kube, config=config),  # type: ignore[arg-type]  # only apply and delete_object
        ref=POOL,
        credential=CredentialDecision(hash=None, generation=1, available=True, changed=False, previous_hash=None),
    )
    asyncio.run(loop._apply_objects(SPEC, clock=0.0, logger=logging.getLogger("test")))
    (policy,) = [o for o in kube.applied if o["kind"] == "NetworkPolicy"]
    assert policy == build_network_policy(POOL, cluster_cidrs=networks(*cidrs))
