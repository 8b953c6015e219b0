"""Certificates of the local stack's TLS (``stack.tls``): a CA, the servers' certificate and a client certificate.

Generated once into ``<data_dir>/tls`` with the ``cryptography`` package and kept across ``stack up``: clients
configured with the CA keep working after a restart. The server certificate is regenerated when the addresses it
must name change (another contact point or broker address), since hostname verification is on by default.
Keys are PKCS#8 PEM, unencrypted, in files only the owner reads: what Kafka's and Cassandra's PEM keystores,
librdkafka and Python's ``ssl`` all load.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from stack.process import write_private

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePrivateKey
    from cryptography.x509 import Certificate

logger = logging.getLogger(__name__)

CA_DAYS = 3650
LEAF_DAYS = 825


@dataclass(frozen=True)
class StackTls:
    """The files of the local stack's TLS, all PEM."""

    folder: Path

    @property
    def ca(self) -> Path:
        """Return the CA certificate clients trust."""
        return self.folder / "ca.pem"

    @property
    def ca_key(self) -> Path:
        """Return the CA's private key (signs the other certificates)."""
        return self.folder / "ca-key.pem"

    @property
    def server_cert(self) -> Path:
        """Return the servers' certificate (chain: leaf then CA)."""
        return self.folder / "server.pem"

    @property
    def server_key(self) -> Path:
        """Return the servers' private key."""
        return self.folder / "server-key.pem"

    @property
    def server_keystore(self) -> Path:
        """Return key and certificate chain in one file: the PEM keystore of Kafka and Cassandra."""
        return self.folder / "server-keystore.pem"

    @property
    def client_cert(self) -> Path:
        """Return a client certificate signed by the CA (for mutual TLS)."""
        return self.folder / "client.pem"

    @property
    def client_key(self) -> Path:
        """Return the client certificate's private key."""
        return self.folder / "client-key.pem"


def ensure_stack_tls(folder: Path, hosts: Sequence[str]) -> StackTls:
    """Create the CA once, and server and client certificates naming ``hosts`` (plus localhost and 127.0.0.1).

    An existing CA is kept; the server certificate is rewritten only when it does not name every host.
    """
    from cryptography import x509  # noqa: PLC0415 - only the stack with TLS needs it
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415

    files = StackTls(folder)
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    if files.ca.exists() and files.ca_key.exists():
        ca_cert = x509.load_pem_x509_certificate(files.ca.read_bytes())
        loaded = serialization.load_pem_private_key(files.ca_key.read_bytes(), password=None)
        ca_key: EllipticCurvePrivateKey = loaded  # type: ignore[assignment]
    else:
        ca_key, ca_cert = _new_ca()
        write_private(files.ca_key, _key_pem(ca_key))
        files.ca.write_text(_cert_pem(ca_cert))
        logger.info("generated the local stack's CA in %s", files.ca)
    names = sorted({"localhost", "127.0.0.1", *hosts})
    if not files.server_keystore.exists() or set(_names(files.server_cert)) != set(names):
        key, cert = _leaf(ca_key, ca_cert, "trends-local-server", names, server=True)
        chain = _cert_pem(cert) + _cert_pem(ca_cert)
        write_private(files.server_key, _key_pem(key))
        write_private(files.server_cert, chain)
        write_private(files.server_keystore, _key_pem(key) + chain)
        logger.info("generated the local stack's server certificate for %s", ", ".join(names))
    if not files.client_cert.exists():
        key, cert = _leaf(ca_key, ca_cert, "trends-client", [], server=False)
        write_private(files.client_key, _key_pem(key))
        write_private(files.client_cert, _cert_pem(cert))
    return files


# -- generation ------------------------------------------------------------------------------------------------
def _new_key() -> EllipticCurvePrivateKey:
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415

    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: EllipticCurvePrivateKey) -> str:
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415

    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def _cert_pem(cert: Certificate) -> str:
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415

    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _new_ca() -> tuple[EllipticCurvePrivateKey, Certificate]:
    from cryptography import x509  # noqa: PLC0415
    from cryptography.hazmat.primitives import hashes  # noqa: PLC0415
    from cryptography.x509.oid import NameOID  # noqa: PLC0415

    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "trends local stack CA")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(hours=1))
        .not_valid_after(now + timedelta(days=CA_DAYS))
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
    return key, cert


def _leaf(
    ca_key: EllipticCurvePrivateKey, ca_cert: Certificate, common_name: str, names: Sequence[str], *, server: bool
) -> tuple[EllipticCurvePrivateKey, Certificate]:
    from cryptography import x509  # noqa: PLC0415
    from cryptography.hazmat.primitives import hashes  # noqa: PLC0415
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: PLC0415

    key = _new_key()
    now = datetime.now(UTC)
    usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH] if server else []
    usages = usages or [ExtendedKeyUsageOID.CLIENT_AUTH]
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(hours=1))
        .not_valid_after(now + timedelta(days=LEAF_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName([_general_name(n) for n in names]), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def _general_name(name: str) -> x509.GeneralName:
    from cryptography import x509  # noqa: PLC0415

    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _names(cert_file: Path) -> list[str]:
    """Return the subject alternative names of a certificate file ([] when there is none)."""
    from cryptography import x509  # noqa: PLC0415

    if not cert_file.exists():
        return []
    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [str(n.value) for n in san]
