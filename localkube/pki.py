"""Throwaway PKI for a loopback control plane: a CA, the apiserver's serving certificate, an
admin client certificate (O=system:masters) and the service-account signing key."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = dt.timedelta(days=7)


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _issue(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    usage: list[x509.ObjectIdentifier] | None = None,
    sans: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_encipherment=not ca, key_cert_sign=ca, crl_sign=ca,
                content_commitment=False, data_encipherment=False, key_agreement=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
    )
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def generate(directory: Path, extra_ips: tuple[str, ...] = ()) -> Pki:
    """Write a fresh PKI into ``directory`` and return the file paths.

    ``extra_ips``: more IP SANs for the serving certificate (a real node's pods and kubelet reach
    the API server at a bridge address, not at 127.0.0.1)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("localkube-ca")
    ca = _issue(ca_name, ca_key, ca_name, ca_key, ca=True)

    serving_key = ec.generate_private_key(ec.SECP256R1())
    serving = _issue(
        _name("kube-apiserver"), serving_key, ca_name, ca_key,
        usage=[ExtendedKeyUsageOID.SERVER_AUTH],
        sans=[
            x509.DNSName("localhost"),
            x509.DNSName("kubernetes.default.svc"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
            *(x509.IPAddress(ipaddress.ip_address(ip)) for ip in extra_ips),
        ],
    )
    admin_key = ec.generate_private_key(ec.SECP256R1())
    admin = _issue(
        _name("localkube-admin", "system:masters"), admin_key, ca_name, ca_key,
        usage=[ExtendedKeyUsageOID.CLIENT_AUTH],
    )
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    files = Pki(
        ca_cert=directory / "ca.crt", ca_key=directory / "ca.key",
        serving_cert=directory / "apiserver.crt", serving_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt", admin_key=directory / "admin.key",
        sa_key=directory / "sa.key", sa_pub=directory / "sa.pub",
    )
    files.ca_cert.write_bytes(_cert_pem(ca))
    files.ca_key.write_bytes(_key_pem(ca_key))
    files.serving_cert.write_bytes(_cert_pem(serving))
    files.serving_key.write_bytes(_key_pem(serving_key))
    files.admin_cert.write_bytes(_cert_pem(admin))
    files.admin_key.write_bytes(_key_pem(admin_key))
    files.sa_key.write_bytes(_key_pem(sa_key))
    files.sa_pub.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    for key in (files.ca_key, files.serving_key, files.admin_key, files.sa_key):
        key.chmod(0o600)
    return files


def webhook_serving(directory: Path, name: str) -> Path:
    """A CA of its own and a serving certificate for 127.0.0.1 signed by it, written as
    controller-runtime's webhook server reads them (``tls.crt`` and ``tls.key`` in ``directory``);
    returns the CA certificate's path (the webhook configurations' caBundle)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name(f"{name}-webhook-ca")
    ca = _issue(ca_name, ca_key, ca_name, ca_key, ca=True)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _issue(_name(f"{name}-webhook"), key, ca_name, ca_key, usage=[ExtendedKeyUsageOID.SERVER_AUTH],
                  sans=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    (directory / "ca.crt").write_bytes(_cert_pem(ca))
    (directory / "tls.crt").write_bytes(_cert_pem(cert))
    (directory / "tls.key").write_bytes(_key_pem(key))
    (directory / "tls.key").chmod(0o600)
    return directory / "ca.crt"


def client_cert(pki: Pki, directory: Path, name: str, cn: str, org: str | None = None) -> tuple[Path, Path]:
    """A client certificate signed by the cluster CA (e.g. CN=system:node:NAME, O=system:nodes for
    a kubelet; CN=system:kube-proxy for kube-proxy); returns (cert, key) paths."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    loaded = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    ca_key = cast(ec.EllipticCurvePrivateKey, loaded)  # the key generate() wrote, which the loader cannot know
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _issue(_name(cn, org), key, ca.subject, ca_key, usage=[ExtendedKeyUsageOID.CLIENT_AUTH])
    crt_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    crt_path.write_bytes(_cert_pem(cert))
    key_path.write_bytes(_key_pem(key))
    key_path.chmod(0o600)
    return crt_path, key_path
