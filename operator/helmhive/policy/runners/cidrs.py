"""The cluster's pod networks, as the operator's ``--runner-cluster-cidrs`` names them. Pure.

Owns parsing and checking the setting (:func:`parse_cluster_cidrs`); the runner pods'
NetworkPolicy excepts these networks from its HTTPS egress
(:func:`helmhive.policy.runners.pool.build_network_policy`). The operator does not discover them.
"""

from __future__ import annotations

import ipaddress

__all__ = ["MAX_CLUSTER_CIDRS", "ClusterCidrError", "ClusterNetwork", "parse_cluster_cidrs"]

ClusterNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
"""One of the cluster's pod networks, excepted from the runners' HTTPS egress."""

MAX_CLUSTER_CIDRS = 32


class ClusterCidrError(ValueError):
    """The cluster CIDRs cannot be used; the message names every bad value."""


def _parse_cidr(text: str) -> ClusterNetwork:
    if "/" not in text:
        raise ClusterCidrError(f"{text!r} has no prefix length (write a network as address/prefix, e.g. 10.244.0.0/16)")
    try:
        network = ipaddress.ip_network(text, strict=False)
    except ValueError as err:
        raise ClusterCidrError(f"{text!r} is not an IPv4 or IPv6 CIDR ({err})") from None
    if network.network_address != ipaddress.ip_interface(text).ip:
        raise ClusterCidrError(f"{text!r} has host bits set (its network is {network})")
    if network.prefixlen == 0:
        # Also refused by the API server: an ``except`` must be a strict subset of its ``cidr``.
        raise ClusterCidrError(f"{text!r} is every address of its family: runners could reach no HTTPS server")
    return network


def parse_cluster_cidrs(text: str) -> tuple[ClusterNetwork, ...]:
    """The cluster's pod networks from a comma-separated list (blank: none), duplicates dropped.

    Raises :class:`ClusterCidrError` naming every value that is not a network in CIDR notation
    (a bare address, host bits set, a ``/0``), and a list longer than :data:`MAX_CLUSTER_CIDRS`.
    The networks come back in canonical form, in the order given.
    """
    if not text.strip():
        return ()
    items = [item.strip() for item in text.split(",")]
    networks: list[ClusterNetwork] = []
    problems: list[str] = []
    if len(items) > MAX_CLUSTER_CIDRS:
        problems.append(f"{len(items)} networks, at most {MAX_CLUSTER_CIDRS}")
    for index, item in enumerate(items, start=1):
        if not item:
            problems.append(f"entry {index} is empty")
            continue
        try:
            network = _parse_cidr(item)
        except ClusterCidrError as err:
            problems.append(str(err))
            continue
        if network not in networks:
            networks.append(network)
    if problems:
        raise ClusterCidrError("; ".join(problems))
    return tuple(networks)
