"""The control plane's certificates and kubeconfigs, checked with ``cryptography``."""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from helmhive.devcluster import pki
from helmhive.devcluster.kubeconfig import build_kubeconfig

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def ca() -> pki.CertKey:
    return pki.build_ca(now=NOW)


def _cert(pair: pki.CertKey) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pair.cert_pem)


def _verify_signed_by(cert: x509.Certificate, ca: pki.CertKey) -> None:
    issuer = _cert(ca).public_key()
    assert isinstance(issuer, ec.EllipticCurvePublicKey)
    issuer.verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(hashes.SHA256()))


def test_ca_is_a_ca(ca: pki.CertKey) -> None:
    cert = _cert(ca)
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert cert.not_valid_after_utc - NOW > dt.timedelta(days=3000)


def test_apiserver_serving_cert_covers_loopback_and_the_service(ca: pki.CertKey) -> None:
    cert = _cert(pki.build_apiserver_serving(ca, now=NOW))
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(sans.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("10.0.0.1"),
    }
    assert {"localhost", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"} <= set(
        sans.get_values_for_type(x509.DNSName)
    )
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in usages
    _verify_signed_by(cert, ca)


def test_admin_client_cert_is_in_system_masters(ca: pki.CertKey) -> None:
    cert = _cert(pki.build_client_cert(ca, common_name="helmhive-admin", organizations=("system:masters",), now=NOW))
    subject = cert.subject
    assert [a.value for a in subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == ["system:masters"]
    assert [a.value for a in subject.get_attributes_for_oid(NameOID.COMMON_NAME)] == ["helmhive-admin"]
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    _verify_signed_by(cert, ca)


def test_service_account_key_is_rsa_and_its_public_half_verifies() -> None:
    private_pem = pki.build_service_account_key()
    key = serialization.load_pem_private_key(private_pem, password=None)
    assert isinstance(key, rsa.RSAPrivateKey)
    assert key.key_size == 2048
    public = serialization.load_pem_public_key(pki.public_key_pem(private_pem))
    assert isinstance(public, rsa.RSAPublicKey)
    signature = key.sign(b"token", padding.PKCS1v15(), hashes.SHA256())
    public.verify(signature, b"token", padding.PKCS1v15(), hashes.SHA256())


def test_ensure_pki_writes_once_and_keeps_a_fresh_set(tmp_path: Path) -> None:
    paths = pki.ensure_pki(tmp_path / "pki", now=NOW)
    for name in pki.PAIRS:
        assert paths.cert(name).is_file()
        assert paths.key(name).stat().st_mode & 0o077 == 0
    kcm = x509.load_pem_x509_certificate(paths.cert("kube-controller-manager").read_bytes())
    assert kcm.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:kube-controller-manager"
    before = {p.name: p.read_bytes() for p in paths.directory.iterdir()}
    pki.ensure_pki(tmp_path / "pki", now=NOW + dt.timedelta(days=30))
    assert {p.name: p.read_bytes() for p in paths.directory.iterdir()} == before


def test_ensure_pki_renews_near_expiry_but_keeps_the_signing_key(tmp_path: Path) -> None:
    paths = pki.ensure_pki(tmp_path, now=NOW)
    ca_before, sa_before = paths.ca_cert.read_bytes(), paths.sa_key.read_bytes()
    pki.ensure_pki(tmp_path, now=NOW + dt.timedelta(days=360))
    assert paths.ca_cert.read_bytes() != ca_before
    assert paths.sa_key.read_bytes() == sa_before


def test_kubeconfig_takes_a_cert_pair_or_a_token(tmp_path: Path) -> None:
    config = build_kubeconfig(
        server="https://127.0.0.1:6443",
        ca_file=tmp_path / "ca.crt",
        user="u",
        client_cert_file=tmp_path / "u.crt",
        client_key_file=tmp_path / "u.key",
    )
    assert config["users"][0]["user"] == {
        "client-certificate": str(tmp_path / "u.crt"),
        "client-key": str(tmp_path / "u.key"),
    }
    assert config["current-context"] == "u@helmhive-dev"
    assert yaml.safe_load(yaml.safe_dump(config)) == config
    with pytest.raises(ValueError):
        build_kubeconfig(server="https://127.0.0.1:1", ca_file=tmp_path, user="u")
    with pytest.raises(ValueError):
        build_kubeconfig(
            server="https://127.0.0.1:1",
            ca_file=tmp_path,
            user="u",
            token="t",
            client_cert_file=tmp_path,
            client_key_file=tmp_path,
        )
