"""Certificates made at test time (the `cryptography` package): self-signed, for 127.0.0.1.

`make_self_signed(folder, name)` writes `<name>.pem` (the certificate, also the CA bundle that trusts it)
and `<name>.key`; a second call with another name is "a wrong CA" for the first server.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path
from typing import NamedTuple

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


class CertFiles(NamedTuple):
    cert: Path  # PEM certificate; as a CA bundle it trusts exactly this server
    key: Path


def make_self_signed(folder: Path, name: str = "server") -> CertFiles:
    """A self-signed certificate for 127.0.0.1 and localhost, valid from an hour ago for a day."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"ocr-capacity test {name}")])
    now = dt.datetime.now(dt.UTC)
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    files = CertFiles(folder / f"{name}.pem", folder / f"{name}.key")
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return files
