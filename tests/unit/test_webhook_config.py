"""The webhook settings, certificate checks, Kopf registry surgery and the Lease decision (no cluster).

The same paths run against the real API server in ``tests/operator/test_webhook_service.py``
and ``tests/operator/test_leader_election.py``.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import kopf
import pytest
from cryptography import x509

from helmhive.controller.app import split_webhooks
from helmhive.controller.leader import LeaseAction, LeaseRecord, build_identity, decide_lease
from helmhive.controller.webhook import (
    RENEW_BEFORE,
    WebhookSettingError,
    build_service_hosts,
    build_serving_certificate,
    certificate_is_usable,
    decide_webhook_config,
    keep_webhooks_when_stopped,
)

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


def _decide(**overrides: Any) -> Any:
    args: dict[str, Any] = {
        "addr": "0.0.0.0",
        "port": 9443,
        "host": "127.0.0.1",
        "service_name": None,
        "service_namespace": None,
        "operator_namespace": "helmhive-system",
        "cert_dir": None,
    }
    args.update(overrides)
    return decide_webhook_config(**args)


def test_url_mode_is_the_default_and_service_mode_defaults_to_the_operator_namespace() -> None:
    assert not _decide().service_mode
    config = _decide(service_name="helmhive-webhook")
    assert config.service_mode
    assert (config.service_name, config.service_namespace) == ("helmhive-webhook", "helmhive-system")
    assert config.secret_name == "helmhive-webhook-cert"
    assert _decide(service_name="w", service_namespace="ops").service_namespace == "ops"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"service_namespace": "ops"}, "--webhook-service-namespace: ServiceNameMissing"),
        ({"service_name": "Bad_Name"}, "--webhook-service-name: InvalidServiceName"),
        ({"service_name": "w", "service_namespace": "-x"}, "--webhook-service-namespace: InvalidNamespace"),
        ({"port": 0}, "--webhook-port: InvalidPort"),
    ],
)
def test_bad_webhook_flags_are_refused_with_the_flag_and_a_reason(overrides: dict[str, Any], expected: str) -> None:
    with pytest.raises(WebhookSettingError) as info:
        _decide(**overrides)
    assert str(info.value).startswith(expected)


def test_a_cert_dir_without_its_key_is_refused(tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_text("x")
    with pytest.raises(WebhookSettingError) as info:
        _decide(cert_dir=tmp_path)
    assert str(info.value).startswith("--webhook-cert-dir: CertificateFileMissing")
    assert "tls.key" in str(info.value)
    (tmp_path / "tls.key").write_text("x")
    assert _decide(cert_dir=tmp_path).cert_dir == tmp_path


def test_the_service_certificate_names_the_service_and_is_renewed_30_days_before_it_expires() -> None:
    hosts = build_service_hosts("helmhive-webhook", "ops")
    assert hosts == ["helmhive-webhook.ops.svc", "helmhive-webhook.ops.svc.cluster.local"]
    cert, _ = build_serving_certificate(hosts=hosts, now=NOW, days=365)
    names = (
        x509.load_pem_x509_certificate(cert)
        .extensions.get_extension_for_class(x509.SubjectAlternativeName)
        .value.get_values_for_type(x509.DNSName)
    )
    assert names == hosts
    assert certificate_is_usable(cert, hosts=hosts, now=NOW)
    assert not certificate_is_usable(cert, hosts=[*hosts, "other.ops.svc"], now=NOW)
    expiry = NOW + dt.timedelta(days=365)
    assert certificate_is_usable(cert, hosts=hosts, now=expiry - RENEW_BEFORE - dt.timedelta(hours=1))
    assert not certificate_is_usable(cert, hosts=hosts, now=expiry - RENEW_BEFORE + dt.timedelta(hours=1))
    assert not certificate_is_usable(b"not a certificate", hosts=hosts, now=NOW)


def _registry() -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.validate("helmhive.dev", "v1alpha1", "profiles", id="v", registry=registry)
    def validate(**_: Any) -> None:
        return None

    @kopf.on.create("helmhive.dev", "v1alpha1", "profiles", registry=registry)
    def create(**_: Any) -> None:
        return None

    return registry


def test_split_copies_or_moves_only_the_admission_handlers() -> None:
    registry = _registry()
    copied = split_webhooks(registry, keep=True)
    assert [h.id for h in copied._webhooks.get_all_handlers()] == ["v"]
    assert [h.id for h in registry._webhooks.get_all_handlers()] == ["v"]
    assert copied._changing.get_all_handlers() == []
    moved = split_webhooks(registry)
    assert [h.id for h in moved._webhooks.get_all_handlers()] == ["v"]
    assert registry._webhooks.get_all_handlers() == []
    assert len(registry._changing.get_all_handlers()) == 1


def test_service_mode_webhooks_outlive_the_process() -> None:
    registry = _registry()
    assert [bool(h.persistent) for h in registry._webhooks.get_all_handlers()] == [False]
    assert keep_webhooks_when_stopped(registry) == 1
    assert [h.persistent for h in registry._webhooks.get_all_handlers()] == [True]
    assert keep_webhooks_when_stopped(registry) == 0


def _record(holder: str | None, duration: int | None = 15) -> LeaseRecord:
    return LeaseRecord(holder=holder, duration_seconds=duration, acquire_time=None, transitions=0, resource_version="1")


@pytest.mark.parametrize(
    ("record", "observed_at", "now", "expected"),
    [
        (None, 0.0, 100.0, LeaseAction.CREATE),
        (_record("me"), 0.0, 100.0, LeaseAction.RENEW),
        (_record(None), 99.0, 100.0, LeaseAction.ACQUIRE),
        (_record(""), 99.0, 100.0, LeaseAction.ACQUIRE),
        (_record("other"), 90.0, 100.0, LeaseAction.WAIT),
        (_record("other"), 85.5, 100.0, LeaseAction.WAIT),
        (_record("other"), 84.9, 100.0, LeaseAction.ACQUIRE),
        (_record("other", duration=None), 84.9, 100.0, LeaseAction.ACQUIRE),
        (_record("other", duration=60), 84.9, 100.0, LeaseAction.WAIT),
    ],
)
def test_a_candidate_takes_the_lease_only_when_absent_released_or_unrenewed_for_its_duration(
    record: LeaseRecord | None, observed_at: float, now: float, expected: LeaseAction
) -> None:
    assert decide_lease(record=record, identity="me", observed_at=observed_at, now=now, default_duration=15) == expected


def test_the_identity_is_the_pod_name_else_the_host_and_a_random_suffix() -> None:
    assert build_identity(pod_name="helmhive-0", hostname="node", token="ab12") == "helmhive-0_ab12"
    assert build_identity(pod_name=None, hostname="node", token="ab12") == "node_ab12"
