"""Waiting for the operator's session witness webhooks, for tests that check who reset a binding."""

from __future__ import annotations

from kubernetes import client

from harness.kube import Kube
from harness.wait import wait_for

__all__ = ["witnesses_ready"]


def witnesses_ready(kube: Kube, *, not_bundle: str | None = None) -> str:
    """Wait until the API server sends binding status writes and deletes to the operator's webhook.

    The operator makes a new serving certificate each time it starts; ``not_bundle`` (the CA bundle
    before a restart) waits for the configuration to carry the new one. Returns the bundle.
    """
    admission = client.AdmissionregistrationV1Api(kube.api_client)

    def ready() -> str | None:
        config = admission.read_validating_webhook_configuration("helmhive.dev")
        hooks = {
            (res, op): hook.client_config.ca_bundle
            for hook in config.webhooks or []
            for rule in hook.rules or []
            for res in rule.resources or []
            for op in rule.operations or []
        }
        bundles = {hooks.get(("sessionbindings/status", "UPDATE")), hooks.get(("sessionbindings", "DELETE"))}
        bundle = bundles.pop() if len(bundles) == 1 else None
        return str(bundle) if bundle and bundle != not_bundle else None

    return wait_for(ready, timeout=60, describe="the operator's session witness webhooks (with its certificate)")
