"""kube-router for a kind cluster: pod routing between nodes, and NetworkPolicy enforcement.

kind's own CNI (kindnet) is turned off: its policy engine needs nft's ``queue`` expression, which
some kernels lack, and it cannot be built offline into the node image anyway. kube-router runs as a
DaemonSet on the host network of every node:

- an init container writes a bridge CNI config; kube-router fills in the node's pod CIDR;
- ``--run-router`` adds routes to the other nodes' pod CIDRs (same L2, so no tunnel);
- ``--run-firewall`` turns NetworkPolicy into iptables and ipset rules;
- kube-proxy (kubeadm's) keeps Services.

The image is Debian plus the tools kube-router calls (iptables, ipset, iproute2, conntrack). This
module only builds manifests; it does no I/O.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["KUBE_ROUTER_DOCKERFILE_PACKAGES", "build_cni_conflist", "build_kube_router_manifests"]

KUBE_ROUTER_DOCKERFILE_PACKAGES = ("iptables", "ipset", "iproute2", "conntrack", "kmod")
NAMESPACE = "kube-system"
NAME = "kube-router"


def build_cni_conflist() -> str:
    """The CNI config each node starts with; kube-router adds ``ipam.subnet`` from the node's pod CIDR."""
    return json.dumps(
        {
            "cniVersion": "0.3.1",
            "name": "kubernetes",
            "plugins": [
                {
                    "name": "kubernetes",
                    "type": "bridge",
                    "bridge": "kube-bridge",
                    "isDefaultGateway": True,
                    "hairpinMode": True,
                    "ipam": {"type": "host-local"},
                },
                {"type": "portmap", "capabilities": {"snat": True, "portMappings": True}},
            ],
        },
        indent=2,
    )


def build_kube_router_manifests(image: str) -> list[dict[str, Any]]:
    """ServiceAccount, RBAC, CNI ConfigMap and DaemonSet for kube-router from ``image``."""
    labels = {"app.kubernetes.io/name": NAME}
    rules = [
        {
            "apiGroups": [""],
            "resources": ["namespaces", "pods", "services", "endpoints"],
            "verbs": ["get", "list", "watch"],
        },
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch", "update"]},
        {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    ]
    volumes = [
        {"name": "lib-modules", "hostPath": {"path": "/lib/modules"}},
        {"name": "cni-conf-dir", "hostPath": {"path": "/etc/cni/net.d"}},
        {"name": "xtables-lock", "hostPath": {"path": "/run/xtables.lock", "type": "FileOrCreate"}},
        {"name": "kube-router-cfg", "configMap": {"name": "kube-router-cfg"}},
    ]
    container = {
        "name": NAME,
        "image": image,
        "imagePullPolicy": "Never",
        "args": [
            "--run-router=true",
            "--run-firewall=true",
            "--run-service-proxy=false",
            "--bgp-graceful-restart=true",
            "--enable-cni=true",
            "--enable-ibgp=true",
            "--enable-overlay=false",
            "--enable-pod-egress=true",
            "--metrics-port=0",
            "--health-port=20244",
        ],
        "env": [
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "KUBE_ROUTER_CNI_CONF_FILE", "value": "/etc/cni/net.d/10-kuberouter.conflist"},
        ],
        "securityContext": {"privileged": True},
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": 20244}, "periodSeconds": 3},
        "volumeMounts": [
            {"name": "lib-modules", "mountPath": "/lib/modules", "readOnly": True},
            {"name": "cni-conf-dir", "mountPath": "/etc/cni/net.d"},
            {"name": "xtables-lock", "mountPath": "/run/xtables.lock"},
        ],
    }
    init = {
        "name": "install-cni",
        "image": image,
        "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c"],
        "args": [
            "set -e; if [ ! -f /etc/cni/net.d/10-kuberouter.conflist ]; then "
            "cp /etc/kube-router/cni-conf.json /etc/cni/net.d/.tmp-kuberouter-cfg && "
            "mv /etc/cni/net.d/.tmp-kuberouter-cfg /etc/cni/net.d/10-kuberouter.conflist; fi"
        ],
        "volumeMounts": [
            {"name": "cni-conf-dir", "mountPath": "/etc/cni/net.d"},
            {"name": "kube-router-cfg", "mountPath": "/etc/kube-router"},
        ],
    }
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAME, "namespace": NAMESPACE}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": NAME},
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": NAME},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "kube-router-cfg", "namespace": NAMESPACE, "labels": labels},
            "data": {"cni-conf.json": build_cni_conflist()},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": labels},
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": NAME,
                        "priorityClassName": "system-node-critical",
                        "hostNetwork": True,
                        "tolerations": [{"operator": "Exists"}],
                        "initContainers": [init],
                        "containers": [container],
                        "volumes": volumes,
                    },
                },
            },
        },
    ]
