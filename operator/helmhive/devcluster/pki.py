"""Certificates and keys for the local control plane, made with ``cryptography``.

The ``build_*`` functions are pure apart from drawing fresh key material: they take the
issuing CA and the current time and return PEM bytes. :func:`ensure_pki` is the only
function that touches the filesystem; it writes a complete set into a directory, or
keeps the one already there while it is complete and far from expiry.

What the control plane needs:

* a CA that signs everything and that clients trust (``ca.crt``);
* a serving certificate for kube-apiserver, valid for 127.0.0.1, localhost and the
  in-cluster names of the ``kubernetes`` Service, including its IP 10.0.0.1;
* a serving certificate for kube-controller-manager's health endpoint on loopback;
* an admin client certificate in group ``system:masters``;
* a client certificate for kube-controller-manager (``system:kube-controller-manager``,
  which the RBAC bootstrap policy binds to the role of that name);
* an RSA key that signs ServiceAccount tokens (and its public half, which verifies them).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "APISERVER_DNS_NAMES",
    "APISERVER_IPS",
    "PAIRS",
    "CertKey",
    "PkiPaths",
    "build_apiserver_serving",
    "build_ca",
    "build_client_cert",
    "build_service_account_key",
    "build_serving_cert",
    "ensure_pki",
    "public_key_pem",
]

APISERVER_DNS_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
APISERVER_IPS = ("127.0.0.1", "10.0.0.1")
LOOPBACK_DNS_NAMES = ("localhost",)
LOOPBACK_IPS = ("127.0.0.1",)

_CA_DAYS = 3650
_LEAF_DAYS = 365
_RENEW_BEFORE = dt.timedelta(days=7)
_BACKDATE = dt.timedelta(minutes=5)

_Key: TypeAlias = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


@dataclass(frozen=True)
class CertKey:
    """A certificate and its private key, both PEM."""

    cert_pem: bytes
    key_pem: bytes


def _new_ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: _Key) -> bytes:
    return key.private_bytes(
        encoding=serialization.Encoding.PEM,
        format=serialization.PrivateFormat.PKCS8,
        encryption_algorithm=serialization.NoEncryption(),
    )


def _load_ca(ca: CertKey) -> tuple[x509.Certificate, _Key]:
    cert = x509.load_pem_x509_certificate(ca.cert_pem)
    key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise TypeError(f"unsupported CA key type {type(key).__name__}")
    return cert, key


def build_ca(*, common_name: str = "helmhive-devcluster-ca", now: dt.datetime) -> CertKey:
    """Return a new self-signed CA valid for ten years from ``now``."""
    key = _new_ec_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + dt.timedelta(days=_CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return CertKey(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _build_leaf(
    ca: CertKey,
    *,
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    now: dt.datetime,
    dns_names: tuple[str, ...] = (),
    ip_addresses: tuple[str, ...] = (),
) -> CertKey:
    ca_cert, ca_key = _load_ca(ca)
    key = _new_ec_key()
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + dt.timedelta(days=_LEAF_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return CertKey(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def build_serving_cert(
    ca: CertKey,
    *,
    common_name: str,
    dns_names: tuple[str, ...],
    ip_addresses: tuple[str, ...],
    now: dt.datetime,
) -> CertKey:
    """Return a TLS server certificate signed by ``ca`` for these names and addresses."""
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    return _build_leaf(
        ca,
        subject=subject,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        now=now,
        dns_names=dns_names,
        ip_addresses=ip_addresses,
    )


def build_apiserver_serving(ca: CertKey, *, now: dt.datetime) -> CertKey:
    """Return kube-apiserver's serving certificate (loopback and the ``kubernetes`` Service)."""
    return build_serving_cert(
        ca, common_name="kube-apiserver", dns_names=APISERVER_DNS_NAMES, ip_addresses=APISERVER_IPS, now=now
    )


def build_client_cert(
    ca: CertKey, *, common_name: str, organizations: tuple[str, ...] = (), now: dt.datetime
) -> CertKey:
    """Return a client certificate: Kubernetes reads CN as the user and each O as a group."""
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return _build_leaf(ca, subject=x509.Name(attrs), usage=ExtendedKeyUsageOID.CLIENT_AUTH, now=now)


def build_service_account_key() -> bytes:
    """Return a new RSA private key (PEM) for signing ServiceAccount tokens."""
    return _key_pem(rsa.generate_private_key(public_exponent=65537, key_size=2048))


def public_key_pem(private_key_pem: bytes) -> bytes:
    """Return the public half of a PEM private key, as PEM."""
    key = serialization.load_pem_private_key(private_key_pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise TypeError(f"unsupported key type {type(key).__name__}")
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


@dataclass(frozen=True)
class PkiPaths:
    """Where :func:`ensure_pki` keeps each file."""

    directory: Path

    def cert(self, name: str) -> Path:
        return self.directory / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.directory / f"{name}.key"

    @property
    def ca_cert(self) -> Path:
        return self.cert("ca")

    @property
    def ca_key(self) -> Path:
        return self.key("ca")

    @property
    def sa_key(self) -> Path:
        return self.directory / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.directory / "sa.pub"


PAIRS = ("ca", "apiserver", "kcm-serving", "admin", "kube-controller-manager")


def _is_fresh(paths: PkiPaths, now: dt.datetime) -> bool:
    files = [paths.cert(n) for n in PAIRS] + [paths.key(n) for n in PAIRS] + [paths.sa_key, paths.sa_pub]
    if not all(f.is_file() for f in files):
        return False
    for name in PAIRS:
        cert = x509.load_pem_x509_certificate(paths.cert(name).read_bytes())
        if cert.not_valid_after_utc - now < _RENEW_BEFORE:
            return False
    return True


def _write_private(path: Path, data: bytes) -> None:
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_bytes(data)


def ensure_pki(directory: Path, *, now: dt.datetime | None = None) -> PkiPaths:
    """Write a complete PKI into ``directory`` unless a fresh one is already there.

    The ServiceAccount signing key is kept when it exists, so tokens minted before a
    restart stay valid; everything else is made anew together.
    """
    paths = PkiPaths(directory)
    current = now or dt.datetime.now(dt.UTC)
    if _is_fresh(paths, current):
        return paths
    directory.mkdir(parents=True, exist_ok=True)
    ca = build_ca(now=current)
    pairs = {
        "ca": ca,
        "apiserver": build_apiserver_serving(ca, now=current),
        "kcm-serving": build_serving_cert(
            ca,
            common_name="kube-controller-manager",
            dns_names=LOOPBACK_DNS_NAMES,
            ip_addresses=LOOPBACK_IPS,
            now=current,
        ),
        "admin": build_client_cert(ca, common_name="helmhive-admin", organizations=("system:masters",), now=current),
        "kube-controller-manager": build_client_cert(ca, common_name="system:kube-controller-manager", now=current),
    }
    for name, pair in pairs.items():
        _write_private(paths.key(name), pair.key_pem)
        paths.cert(name).write_bytes(pair.cert_pem)
    if not paths.sa_key.is_file():
        _write_private(paths.sa_key, build_service_account_key())
    paths.sa_pub.write_bytes(public_key_pem(paths.sa_key.read_bytes()))
    return paths
