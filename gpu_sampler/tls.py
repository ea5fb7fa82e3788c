"""TLS for every request the suite makes, in one place: the same trust for the pre-flight, the load,
/metrics, the DCGM exporter and the sidecar.

- Certificates are verified by default, against the system's CA store.
- `ca_pem` (CA_BUNDLE's content, carried in the config so remote workers need no file) replaces that
  store: only those CAs are trusted, as `curl --cacert` does.
- `insecure` (INSECURE=1) turns verification off everywhere, as Locust's FastHttpUser does by default.
A certificate the client refuses is one line naming both fixes (`refused_line`).
"""

from __future__ import annotations

import hashlib
import ssl
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

FIX = "give the CA that signed it with CA_BUNDLE=/path/ca.pem (--ca-bundle), or skip the check with INSECURE=1 (--insecure)"


class CaBundleError(ValueError):
    """A CA bundle that cannot be read or holds no certificate; one line naming the fix."""


@dataclass(frozen=True)
class TlsSettings:
    insecure: bool = False
    ca_pem: str = field(default="", repr=False)  # PEM text of the CAs to trust; "" = the system's store

    def context(self) -> ssl.SSLContext:
        """The client context, built once per settings object and shared (an SSLContext is safe to
        share between threads and connections)."""
        return self._context

    @cached_property
    def _context(self) -> ssl.SSLContext:
        # built with the names `ssl` has at first use: a gevent-patched process (Locust) gets gevent's
        # SSLContext, whose handshakes yield to other greenlets; a plain process the stdlib's
        if self.insecure:
            return ssl._create_unverified_context()  # noqa: S323 - asked for with INSECURE=1
        if self.ca_pem:
            return ssl.create_default_context(cadata=self.ca_pem)
        return ssl.create_default_context()

    def fingerprint(self) -> str:
        """What the manifest records of the CA bundle: its hash, never its text."""
        return "sha256:" + hashlib.sha256(self.ca_pem.encode()).hexdigest()[:16] if self.ca_pem else ""


def read_ca_bundle(path: str) -> str:
    """The PEM text of a CA bundle file, checked to load as CAs; `CaBundleError` (one line) otherwise."""
    try:
        text = Path(path).read_text(encoding="ascii")
    except FileNotFoundError:
        raise CaBundleError(f"CA_BUNDLE={path}: no such file: give a PEM file of CA certificates") from None
    except (OSError, UnicodeDecodeError) as err:
        raise CaBundleError(f"CA_BUNDLE={path} cannot be read ({err}): give a PEM file of CA certificates") from None
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise CaBundleError(f"CA_BUNDLE={path} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    try:
        ssl.create_default_context(cadata=text)
    except (ssl.SSLError, ValueError) as err:
        raise CaBundleError(f"CA_BUNDLE={path} is not a valid PEM CA bundle ({err})") from None
    return text


def is_tls_error(err: BaseException) -> bool:
    """A failed TLS handshake: a refused certificate, or a peer that does not speak TLS."""
    return isinstance(err, ssl.SSLError)


def refused_line(where: str, err: BaseException) -> str:
    """One line for an HTTPS peer whose certificate was not accepted, or that does not speak TLS."""
    if isinstance(err, ssl.SSLCertVerificationError):
        why = getattr(err, "verify_message", "") or str(err)
        return f"the TLS certificate of {where} was not accepted ({why}): {FIX}"
    reason = getattr(err, "reason", "") or str(err)
    return f"TLS with {where} failed ({reason}): check that it serves HTTPS on that port, or use http://"


def server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A server context from a certificate chain and its key (sidecar --tls-cert/--tls-key)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    return context
