"""The operator's admission webhook server: a self-managed certificate and Kopf's managed config.

The operator generates a self-signed serving certificate at startup (with the
``cryptography`` package), serves Kopf's admission handlers over HTTPS, and lets Kopf keep
the ``helmhive.dev`` Validating/MutatingWebhookConfigurations pointed at it with that
certificate as the CA bundle. A restart makes a new certificate and re-patches the
configurations, so there is nothing to rotate by hand.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import tempfile
from dataclasses import dataclass
from pathlib import Path

import kopf
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["WebhookConfig", "build_serving_certificate", "configure_webhook_server"]

WEBHOOK_CONFIG_NAME = "helmhive.dev"


@dataclass(frozen=True, kw_only=True)
class WebhookConfig:
    """Where the webhook listens, and the host name the API server uses to reach it."""

    addr: str = "0.0.0.0"
    port: int = 9443
    host: str = "127.0.0.1"


def build_serving_certificate(*, hosts: list[str], now: dt.datetime, days: int = 365) -> tuple[bytes, bytes]:
    """Return (certificate PEM, private key PEM) of a self-signed cert valid for ``hosts``."""
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0][:64])])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert_pem, key_pem


def configure_webhook_server(settings: kopf.OperatorSettings, config: WebhookConfig, *, now: dt.datetime) -> Path:
    """Write a fresh certificate to a private temp dir and point Kopf's webhook server at it."""
    directory = Path(tempfile.mkdtemp(prefix="helmhive-webhook-"))
    directory.chmod(0o700)
    hosts = [config.host, "localhost", "127.0.0.1"]
    cert, key = build_serving_certificate(hosts=list(dict.fromkeys(hosts)), now=now)
    (directory / "tls.crt").write_bytes(cert)
    (directory / "tls.key").write_bytes(key)
    (directory / "tls.key").chmod(0o600)
    settings.admission.server = kopf.WebhookServer(
        addr=config.addr,
        port=config.port,
        host=config.host,
        certfile=str(directory / "tls.crt"),
        pkeyfile=str(directory / "tls.key"),
    )
    settings.admission.managed = WEBHOOK_CONFIG_NAME
    return directory
