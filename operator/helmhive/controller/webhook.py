"""The operator's admission webhook server: its certificate, and how the API server reaches it.

Owns: the ``--webhook-*`` settings (:class:`WebhookConfig`, checked by
:func:`decide_webhook_config`), the serving certificate, and the Kopf webhook server whose
client config Kopf writes into the ``helmhive.dev`` Validating/MutatingWebhookConfigurations.

Two ways for the API server to reach the webhook (``docs/webhook.md``):

URL mode (``helmhive operator run`` on a laptop, the default)
    ``clientConfig.url: https://<--webhook-host>:<--webhook-port>/<handler>``. The certificate
    is self-signed at every start for the host, ``localhost`` and ``127.0.0.1``. On a graceful
    stop Kopf removes the webhooks again, so a stopped laptop operator blocks nothing.
Service mode (``--webhook-service-name``, what the chart uses)
    ``clientConfig.service: {namespace, name, port: 443, path}``. The API server dials the
    Service (``name.namespace.svc``). The webhooks stay registered when a replica stops: with
    ``failurePolicy: Fail`` a Profile write is refused while no replica answers (fail closed).

Certificates: ``--webhook-cert-dir`` (cert-manager's ``tls.crt``/``tls.key``/``ca.crt``) is used
as is and re-read when it changes; the CA bundle written is that directory's ``ca.crt``, the
value cert-manager's CA injector writes too. Otherwise the certificate is self-managed: in
service mode it is kept in the Secret ``<service>-cert`` (owned by the Service) so every replica
serves the same one, valid for ``name.ns.svc`` and ``name.ns.svc.cluster.local``, and replaced
at a start when it has less than 30 days left.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime as dt
import ipaddress
import logging
import re
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kopf
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from helmhive.controller.kube.door import Conflict, Kube, NotFound

__all__ = [
    "RENEW_BEFORE",
    "SERVICE_PORT",
    "WEBHOOK_CONFIG_NAME",
    "HelmhiveWebhookServer",
    "WebhookConfig",
    "WebhookSettingError",
    "build_service_hosts",
    "build_serving_certificate",
    "certificate_is_usable",
    "configure_webhook_server",
    "decide_webhook_config",
    "ensure_shared_certificate",
    "keep_webhooks_when_stopped",
]

log = logging.getLogger("helmhive.webhook")

WEBHOOK_CONFIG_NAME = "helmhive.dev"
SERVICE_PORT = 443
"""The webhook Service's port the configurations name (the chart maps it to the container's ``webhook`` port)."""
RENEW_BEFORE = dt.timedelta(days=30)
CERT_DAYS = 365
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class WebhookSettingError(ValueError):
    """A webhook setting that cannot work: the message starts with the flag and a reason name."""


@dataclass(frozen=True, kw_only=True)
class WebhookConfig:
    """Where the webhook listens, how the API server reaches it, and where its certificate comes from."""

    addr: str = "0.0.0.0"
    port: int = 9443
    host: str = "127.0.0.1"
    service_name: str | None = None
    service_namespace: str | None = None
    cert_dir: Path | None = None

    @property
    def service_mode(self) -> bool:
        return self.service_name is not None

    @property
    def secret_name(self) -> str:
        """The Secret holding the self-managed certificate in service mode."""
        return f"{self.service_name}-cert"


def decide_webhook_config(
    *,
    addr: str,
    port: int,
    host: str,
    service_name: str | None,
    service_namespace: str | None,
    operator_namespace: str,
    cert_dir: Path | None,
) -> WebhookConfig:
    """Check the ``--webhook-*`` flags; the Service's namespace defaults to the operator's."""
    if service_namespace and not service_name:
        raise WebhookSettingError(
            "--webhook-service-namespace: ServiceNameMissing: a Service namespace needs --webhook-service-name"
        )
    if service_name is not None and (len(service_name) > 63 or not _DNS_LABEL.match(service_name)):
        raise WebhookSettingError(
            f"--webhook-service-name: InvalidServiceName: {service_name!r} is not a DNS-1035 label "
            "(lower-case letters, digits and '-', starting with a letter, at most 63 characters)"
        )
    namespace = (service_namespace or operator_namespace) if service_name else None
    if namespace is not None and (len(namespace) > 63 or not _DNS_1123_LABEL.match(namespace)):
        raise WebhookSettingError(
            f"--webhook-service-namespace: InvalidNamespace: {namespace!r} is not a DNS-1123 label"
        )
    if not 0 < port < 65536:
        raise WebhookSettingError(f"--webhook-port: InvalidPort: {port} is not a TCP port (1-65535)")
    if cert_dir is not None:
        for required in ("tls.crt", "tls.key"):
            if not (cert_dir / required).is_file():
                raise WebhookSettingError(
                    f"--webhook-cert-dir: CertificateFileMissing: {cert_dir / required} does not exist "
                    "(the directory must hold tls.crt and tls.key, and ca.crt for the CA bundle)"
                )
    return WebhookConfig(
        addr=addr, port=port, host=host, service_name=service_name, service_namespace=namespace, cert_dir=cert_dir
    )


def build_service_hosts(name: str, namespace: str) -> list[str]:
    """The DNS names the API server may use for Service ``namespace/name`` (it verifies ``name.ns.svc``)."""
    return [f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local"]


def build_serving_certificate(*, hosts: list[str], now: dt.datetime, days: int = CERT_DAYS) -> tuple[bytes, bytes]:
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


def certificate_is_usable(cert_pem: bytes, *, hosts: list[str], now: dt.datetime) -> bool:
    """True if ``cert_pem`` names every one of ``hosts`` and is valid for more than :data:`RENEW_BEFORE`."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        names = set(
            cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
        )
    except (ValueError, x509.ExtensionNotFound):
        return False
    return set(hosts) <= names and cert.not_valid_before_utc <= now < cert.not_valid_after_utc - RENEW_BEFORE


async def _read_service_owner(kube: Kube, name: str, namespace: str) -> list[dict[str, Any]]:
    try:
        service = await kube.read_object("v1", "Service", name, namespace)
    except NotFound:
        log.warning("webhook Service %s/%s not found; its certificate Secret gets no owner", namespace, name)
        return []
    uid = (service.get("metadata") or {}).get("uid")
    return [{"apiVersion": "v1", "kind": "Service", "name": name, "uid": uid}] if uid else []


async def ensure_shared_certificate(kube: Kube, config: WebhookConfig, *, now: dt.datetime) -> tuple[bytes, bytes]:
    """The service-mode certificate every replica shares: reuse the Secret's, or write a new one.

    Two replicas starting at once may both write; the loser's create or replace conflicts and it
    re-reads the winner's. The key never leaves the Secret and the operator's private files.
    """
    assert config.service_name is not None and config.service_namespace is not None
    name, namespace = config.secret_name, config.service_namespace
    hosts = build_service_hosts(config.service_name, namespace)
    for _ in range(5):
        try:
            current: dict[str, Any] | None = await kube.read_object("v1", "Secret", name, namespace)
        except NotFound:
            current = None
        if current is not None:
            data = current.get("data") or {}
            cert = base64.b64decode(data.get("tls.crt", ""))
            key = base64.b64decode(data.get("tls.key", ""))
            if cert and key and certificate_is_usable(cert, hosts=hosts, now=now):
                return cert, key
        cert, key = build_serving_certificate(hosts=hosts, now=now)
        encoded = {k: base64.b64encode(v).decode("ascii") for k, v in (("tls.crt", cert), ("tls.key", key))}
        metadata: dict[str, Any] = {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "helmhive", "app.kubernetes.io/component": "webhook"},
        }
        owners = await _read_service_owner(kube, config.service_name, namespace)
        if owners:
            metadata["ownerReferences"] = owners
        if current is not None:
            metadata["resourceVersion"] = current["metadata"]["resourceVersion"]
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": metadata,
            "type": "kubernetes.io/tls",
            "data": {**encoded, "ca.crt": encoded["tls.crt"]},
        }
        try:
            if current is None:
                await kube.create_object(body)
            else:
                await kube.replace_object(body)
        except Conflict:
            continue  # another replica wrote it first: use theirs
        log.info("webhook certificate written to Secret %s/%s for %s", namespace, name, ", ".join(hosts))
        return cert, key
    raise RuntimeError(f"Secret {namespace}/{name}: CertificateConflict: five writes in a row conflicted")


class HelmhiveWebhookServer(kopf.WebhookServer):
    """Kopf's HTTPS webhook server, yielding a Service-based client config in service mode.

    ``kopf.WebhookServer`` yields ``{url, caBundle}``; Kopf appends each handler's id to the URL's
    or the Service's ``path`` when it builds the configurations, so only the target changes here.
    ``inject_ca=False`` leaves ``caBundle`` out (a certificate directory without ``ca.crt``).
    """

    def __init__(
        self, *, service: kopf.WebhookClientConfigService | None = None, inject_ca: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.service = service
        self.inject_ca = inject_ca

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        async for served in super().__call__(fn):
            config = served
            if self.service is not None:
                config = kopf.WebhookClientConfig(service=kopf.WebhookClientConfigService(**self.service))
                if "caBundle" in served:
                    config["caBundle"] = served["caBundle"]
            if not self.inject_ca:
                config.pop("caBundle", None)
            yield config


def keep_webhooks_when_stopped(registry: kopf.OperatorRegistry) -> int:
    """Mark every webhook handler persistent, so Kopf leaves it registered when this process stops.

    Kopf removes non-persistent webhooks from its managed configurations on exit. With replicas
    behind a Service that would unregister them for the replicas still running (and fail open);
    persistent, the configuration outlives any one replica. Returns how many handlers changed.
    """
    handlers = registry._webhooks._handlers
    changed = 0
    for index, handler in enumerate(handlers):
        if not handler.persistent:
            handlers[index] = dataclasses.replace(handler, persistent=True)
            changed += 1
    return changed


async def _prepare_certificate_files(
    config: WebhookConfig, *, now: dt.datetime, kube: Kube
) -> tuple[Path, Path, Path | None, bool]:
    """(cert file, key file, CA file or None, whether to inject a CA bundle) for ``config``."""
    if config.cert_dir is not None:
        certfile, keyfile, cafile = config.cert_dir / "tls.crt", config.cert_dir / "tls.key", config.cert_dir / "ca.crt"
        if cafile.is_file():
            return certfile, keyfile, cafile, True
        log.warning("%s has no ca.crt: the webhook configurations get no caBundle", config.cert_dir)
        return certfile, keyfile, None, False
    if config.service_mode:
        cert, key = await ensure_shared_certificate(kube, config, now=now)
    else:
        cert, key = await asyncio.to_thread(
            build_serving_certificate, hosts=list(dict.fromkeys([config.host, "localhost", "127.0.0.1"])), now=now
        )
    directory = Path(tempfile.mkdtemp(prefix="helmhive-webhook-"))  # mkdtemp makes it 0700
    certfile, keyfile = directory / "tls.crt", directory / "tls.key"
    certfile.write_bytes(cert)
    keyfile.touch(mode=0o600)
    keyfile.write_bytes(key)
    return certfile, keyfile, None, True


async def configure_webhook_server(
    settings: kopf.OperatorSettings, config: WebhookConfig, *, now: dt.datetime, kube: Kube
) -> None:
    """Prepare the certificate and point Kopf's managed webhook server at it."""
    certfile, keyfile, cafile, inject_ca = await _prepare_certificate_files(config, now=now, kube=kube)
    service = None
    if config.service_mode:
        service = kopf.WebhookClientConfigService(
            namespace=config.service_namespace, name=config.service_name, port=SERVICE_PORT
        )
    settings.admission.server = HelmhiveWebhookServer(
        addr=config.addr,
        port=config.port,
        host=config.host,
        certfile=str(certfile),
        pkeyfile=str(keyfile),
        cafile=str(cafile) if cafile is not None else None,
        service=service,
        inject_ca=inject_ca,
    )
    settings.admission.managed = WEBHOOK_CONFIG_NAME
