"""A replica that becomes the leader keeps answering admission requests while it switches.

A leader-elected process serves the webhooks as a standby. It used to stop that Kopf run and
start the whole operator when it took the Lease, so its webhook port was closed for the seconds
between the two, and the API server's calls got ``connection refused`` (or ``EOF``): with
``failurePolicy: Fail`` a user's write failed. The kind tier hit it applying right after
``helm install``. Now the webhooks' run lasts the process's whole life (``helmhive.controller.app``).

Here a Lease held by someone else keeps the operator a standby until the test lets it expire.
Server-side dry-run creates of a widening Profile are sent one after another from before the
takeover until well after the new run serves: every one must be *answered* by the webhook (denied
with its field path), none refused for want of a listener.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from harness.kube import Kube
from harness.operator import OperatorFactory, WebhookService, host_ip
from harness.wait import wait_for

GROUP, VERSION = "helmhive.dev", "v1alpha1"
LEASE = "helmhive-operator"
WIDE = {
    "apiVersion": f"{GROUP}/{VERSION}",
    "kind": "Profile",
    "metadata": {"name": "too-wide"},
    "spec": {
        "envelope": "change-review",
        "purpose": "Review small diffs.",
        "instructions": "Look for bugs.",
        "filesystem": "write",
        "providerMappings": [{"provider": "anthropic", "model": "claude-sonnet-4-5"}],
    },
}
ANSWER = "spec.filesystem: FilesystemWiderThanEnvelope"
FULL_RUN_UP = "kopf's indexes are filled"


def _hold_lease(kube: Kube, namespace: str, *, seconds: int) -> None:
    """A Lease held by another identity, renewed now: the operator waits it out as a standby."""
    now = dt.datetime.now(dt.UTC)
    body = client.V1Lease(
        metadata=client.V1ObjectMeta(name=LEASE, namespace=namespace),
        spec=client.V1LeaseSpec(
            holder_identity="someone-else_00000000",
            lease_duration_seconds=seconds,
            acquire_time=now,
            renew_time=now,
            lease_transitions=0,
        ),
    )
    client.CoordinationV1Api(kube.api_client).create_namespaced_lease(namespace, body)


def _holder(kube: Kube, namespace: str) -> str:
    lease = client.CoordinationV1Api(kube.api_client).read_namespaced_lease(LEASE, namespace)
    return str(lease.spec.holder_identity or "")


def _dry_run(kube: Kube, namespace: str) -> str:
    """What the API server answered to a dry-run create of the widening Profile."""
    try:
        kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "profiles", WIDE, dry_run="All")
    except ApiException as exc:
        return str(exc.body)
    return "admitted"


def test_the_webhook_answers_through_the_standby_to_leader_switch(
    operator_factory: OperatorFactory, kube: Kube, namespace: str
) -> None:
    address = host_ip()
    service = WebhookService(core=kube.core, discovery=client.DiscoveryV1Api(kube.api_client), namespace=namespace)
    service.create()
    _hold_lease(kube, namespace, seconds=20)
    flags = [*service.service_args(), "--leader-election", f"--leader-election-namespace={namespace}"]
    operator = operator_factory("switching", args=flags, env={"POD_NAME": "switching"}, webhook_addr=address)
    service.add_endpoint("a", address, operator.webhook_port)
    # As a standby it already answers.
    wait_for(lambda: ANSWER in _dry_run(kube, namespace), timeout=60, describe="the standby's webhook to answer")
    assert not _holder(kube, namespace).startswith("switching_"), "the standby took a held Lease"

    answers: list[str] = []

    def send_until(done: Callable[[], bool]) -> bool:
        answers.append(_dry_run(kube, namespace))
        return done()

    # Writes one after another from the standby, through the takeover, until the full run is up
    # (its job steps run), then 50 more: every one must be answered.
    wait_for(
        lambda: send_until(lambda: _holder(kube, namespace).startswith("switching_")),
        timeout=180,
        interval=0,
        describe="the operator to take the expired Lease",
    )
    before_lease = len(answers)
    wait_for(
        lambda: send_until(lambda: FULL_RUN_UP in operator.log_text()),
        timeout=180,
        interval=0,
        describe="the leader's full run to start",
    )
    for _ in range(50):
        answers.append(_dry_run(kube, namespace))
    unanswered = [text for text in answers if ANSWER not in text]
    assert not unanswered, f"{len(unanswered)} of {len(answers)} writes were not answered, first: {unanswered[0]}"
    assert before_lease > 1 and len(answers) > before_lease + 50, "no write was sent during the switch"
    assert "leads; starting the operator" in operator.log_text(), operator.log_tail()
    profiles = kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "profiles")["items"]
    assert profiles == []
