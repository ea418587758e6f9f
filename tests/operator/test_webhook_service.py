"""The admission webhooks in service mode, through a real Service, on the local control plane.

The chart runs the operator with ``--webhook-service-name/--webhook-service-namespace``: the
webhook configurations name the Service rather than a URL. kube-apiserver runs with
``--enable-aggregator-routing=true`` (``helmhive.devcluster.flags``), so it dials one of the
Service's EndpointSlice addresses, verifying the certificate for ``<name>.<ns>.svc``. There is no
kubelet or kube-proxy here: the Service has no selector, and the test writes the EndpointSlice
the EndpointSlice controller would write for the operator's pod, pointing at the operator process
on this host's own address (Kubernetes refuses loopback endpoint addresses).
"""

from __future__ import annotations

import base64
import json
from typing import Any

import yaml
from kubernetes import client

from harness.kube import Kube
from harness.kubectl import Kubectl
from harness.operator import OperatorFactory, WebhookService, host_ip
from harness.wait import wait_for

GROUP, VERSION = "helmhive.dev", "v1alpha1"
ACTOR = "helmhive.dev/changed-by"


def _profile(name: str, **spec: Any) -> dict[str, Any]:
    body = {
        "envelope": "review-probe",
        "purpose": "Review small diffs.",
        "instructions": "Look for bugs.",
        "providerMappings": [{"provider": "anthropic", "model": "claude-sonnet-4-5"}],
    }
    body.update(spec)
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Profile", "metadata": {"name": name}, "spec": body}


def _memory(name: str) -> dict[str, Any]:
    spec = {
        "workspace": "payments",
        "scope": {"type": "workspace"},
        "kind": "constraint",
        "text": "Amounts are integer cents.",
        "source": {"type": "adr", "url": "https://example.com/adr/4"},
        "sensitivity": "internal",
    }
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "MemoryRecord", "metadata": {"name": name}, "spec": spec}


def _configurations(kubectl: Kubectl) -> list[dict[str, Any]]:
    found = []
    for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
        proc = kubectl("get", kind, "helmhive.dev", "-o", "json", check=False)
        if proc.returncode == 0:
            found.append(json.loads(proc.stdout))
    return found


def test_a_widening_profile_is_refused_through_the_service_and_fails_closed_when_the_operator_is_down(
    operator_factory: OperatorFactory, kube: Kube, kubectl: Kubectl, namespace: str
) -> None:
    address = host_ip()
    service = WebhookService(core=kube.core, discovery=client.DiscoveryV1Api(kube.api_client), namespace=namespace)
    service.create()
    operator = operator_factory("service-mode", args=service.service_args(), webhook_addr=address)
    service.add_endpoint("a", address, operator.webhook_port)

    # The configurations name the Service (port 443, one path per handler), never a URL, and
    # carry the CA of the certificate the operator keeps in the Secret <service>-cert.
    def registered() -> list[dict[str, Any]]:
        configs = _configurations(kubectl)
        assert len(configs) == 2 and all(c.get("webhooks") for c in configs), configs
        return configs

    configs = wait_for(registered, timeout=60, describe="both webhook configurations")
    secret = kube.core.read_namespaced_secret("helmhive-webhook-cert", namespace)
    assert secret.type == "kubernetes.io/tls"
    assert [(o.kind, o.name) for o in secret.metadata.owner_references] == [("Service", "helmhive-webhook")]
    ca_bundle = secret.data["ca.crt"]
    webhooks = {w["name"]: w for c in configs for w in c["webhooks"]}
    assert "profile-narrowing.helmhive.dev" in webhooks
    for name, webhook in webhooks.items():
        config = webhook["clientConfig"]
        assert "url" not in config, name
        handler = name.removesuffix(".helmhive.dev")
        assert config["service"] == {
            "namespace": namespace,
            "name": "helmhive-webhook",
            "port": 443,
            "path": f"/{handler}",
        }
        assert config["caBundle"] == ca_bundle
    narrowing = webhooks["profile-narrowing.helmhive.dev"]
    assert narrowing["failurePolicy"] == "Fail"
    assert webhooks["stamp-actor-memoryrecords.helmhive.dev"]["failurePolicy"] == "Ignore"
    assert b"PRIVATE KEY" not in base64.b64decode(ca_bundle)

    # Through the Service: a widening profile is refused with field paths, a narrow one admitted.
    bad = _profile("too-wide", envelope="change-review", filesystem="write", tools=["read", "edit"])
    proc = kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(bad), check=False)
    assert proc.returncode != 0
    assert "spec.filesystem: FilesystemWiderThanEnvelope" in proc.stderr
    assert "spec.tools[1]: ToolOutsideEnvelope" in proc.stderr
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(_profile("narrow")))
    stamped = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "profiles", "narrow")
    assert ACTOR in stamped["metadata"]["annotations"], "the mutating webhook answered through the Service too"

    # The operator stops gracefully: in service mode the configurations stay (fail closed).
    operator.stop()
    assert [len(c["webhooks"]) for c in _configurations(kubectl)] == [len(c["webhooks"]) for c in configs]
    for body in (bad, _profile("narrow-too")):
        proc = kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(body), check=False)
        assert proc.returncode != 0, f"{body['metadata']['name']} was admitted with no webhook answering"
        assert 'failed calling webhook "profile-narrowing.helmhive.dev"' in proc.stderr, proc.stderr
        assert f"helmhive-webhook.{namespace}.svc:443" in proc.stderr, proc.stderr
    profiles = kubectl("get", "profiles", "-n", namespace, "-o", "name").stdout.split()
    assert profiles == ["profile.helmhive.dev/narrow"]
    # failurePolicy Ignore: a MemoryRecord is written, only without the actor stamp.
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(_memory("while-down")))
    record = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "memoryrecords", "while-down")
    assert ACTOR not in (record["metadata"].get("annotations") or {})

    # Started again, it serves the same certificate from the Secret, and writes are admitted again.
    version = secret.metadata.resource_version
    operator.start()
    wait_for(
        lambda: (
            (
                kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(_profile("narrow-too")), check=False)
            ).returncode
            == 0
        ),
        timeout=60,
        describe="a narrow profile to be admitted once the operator is back",
    )
    assert kube.core.read_namespaced_secret("helmhive-webhook-cert", namespace).metadata.resource_version == version
    assert "PRIVATE KEY" not in operator.log_text()
