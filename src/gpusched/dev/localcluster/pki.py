"""Certificates, keys and kubeconfigs for a loopback control plane.

Every component authenticates with its own client certificate, as on a real cluster, so that RBAC
is exercised: the controller manager and scheduler get their built-in identities and roles, and
tests can mint further identities (e.g. a component's ServiceAccount) to prove RBAC is sufficient.
ECDSA P-256 keys keep generation instant.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class KeyPair:
    """PEM files of one certificate and its private key."""

    cert: Path
    key: Path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    attributes += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    return x509.Name(attributes)


class CertificateAuthority:
    """A throwaway CA that signs the serving and client certificates of one local cluster."""

    def __init__(
        self, directory: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
    ) -> None:
        self.directory = directory
        self._cert = cert
        self._key = key

    @property
    def cert_path(self) -> Path:
        """PEM file of the CA certificate."""
        return self.directory / "ca.crt"

    @classmethod
    def create(cls, directory: Path) -> CertificateAuthority:
        """A new CA, written to ``directory/ca.{crt,key}``."""
        directory.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        name = _name("gpusched-local-ca")
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        (directory / "ca.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(directory / "ca.key", key)
        return cls(directory, cert, key)

    @classmethod
    def load(cls, directory: Path) -> CertificateAuthority:
        """The CA an earlier ``create`` wrote to ``directory``."""
        cert = x509.load_pem_x509_certificate((directory / "ca.crt").read_bytes())
        key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{directory / 'ca.key'} is not an EC private key")
        return cls(directory, cert, key)

    def issue(
        self,
        name: str,
        common_name: str,
        organizations: tuple[str, ...] = (),
        *,
        server_names: tuple[str, ...] = (),
        server_ips: tuple[str, ...] = (),
    ) -> KeyPair:
        """Sign a certificate; with ``server_names``/``server_ips`` it is a serving cert."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        serving = bool(server_names or server_ips)
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] if serving else [ExtendedKeyUsageOID.CLIENT_AUTH]
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, organizations))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if serving:
            alt: list[x509.GeneralName] = [x509.DNSName(n) for n in server_names]
            alt += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in server_ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        pair = KeyPair(self.directory / f"{name}.crt", self.directory / f"{name}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(pair.key, key)
        return pair


def write_service_account_keys(directory: Path) -> KeyPair:
    """The key pair ServiceAccount tokens are signed with (``cert`` holds the public key)."""
    key = ec.generate_private_key(ec.SECP256R1())
    pair = KeyPair(directory / "sa.pub", directory / "sa.key")
    _write_key(pair.key, key)
    pair.cert.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pair


def write_kubeconfig(
    path: Path,
    server: str,
    ca: Path,
    user: str,
    *,
    credentials: KeyPair | None = None,
    token: str | None = None,
) -> Path:
    """A kubeconfig with one cluster, one user and one current context.

    The user authenticates with a client certificate (``credentials``) or a bearer token, e.g. a
    ServiceAccount's, which is how tests run a component under its own RBAC.
    """
    auth: dict[str, str]
    if token is not None and credentials is None:
        auth = {"token": token}
    elif credentials is not None and token is None:
        auth = {"client-certificate": str(credentials.cert), "client-key": str(credentials.key)}
    else:
        raise ValueError("give exactly one of credentials and token")
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "gpusched-local",
                "cluster": {"server": server, "certificate-authority": str(ca)},
            }
        ],
        "users": [{"name": user, "user": auth}],
        "contexts": [
            {"name": "gpusched-local", "context": {"cluster": "gpusched-local", "user": user}}
        ],
        "current-context": "gpusched-local",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path
