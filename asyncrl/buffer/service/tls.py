"""TLS for the job's Redis (``buffer.tls_dir``): the files, and making them when missing.

``asyncrl launch buffer buffer.tls_dir=DIR`` serves Redis over TLS only. ``DIR`` holds

    ca.crt      the certificate clients verify the server with (give it to every host)
    redis.crt   the server's certificate, signed by ca.crt, naming the server's IPs
    redis.key   its private key (mode 0600)

Bring your own (e.g. from the cluster's PKI) or let ``ensure`` make a private CA and a server
certificate for the advertised address and loopback (``ca.key`` stays in ``DIR``, mode 0600,
for re-issuing). Clients reach the server with ``rediss://...?ssl_ca_certs=DIR/ca.crt``: the
URL files ``launch buffer`` writes carry it, so a role needs nothing else than its URL file
and ``ca.crt`` at that path. TLS encrypts and authenticates the *server*; clients still
authenticate with their ACL user's password (no client certificates).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from asyncrl.core.runtime.rundir import write_atomic

VALID_DAYS = 365


@dataclass(frozen=True)
class TlsFiles:
    """Absolute paths of the CA certificate, the server certificate and its key."""

    ca: Path
    cert: Path
    key: Path

    @classmethod
    def in_dir(cls, tls_dir: str | os.PathLike) -> TlsFiles:
        d = Path(tls_dir).expanduser().resolve()
        return cls(d / "ca.crt", d / "redis.crt", d / "redis.key")

    def client_query(self) -> str:
        """The URL query that makes a redis-py client verify the server with ``ca``."""
        return f"ssl_ca_certs={self.ca}&ssl_cert_reqs=required&ssl_check_hostname=true"


class TlsError(ValueError):
    """The TLS files are missing, unreadable, or do not name the server's address."""


def ensure(tls_dir: str | os.PathLike, ips: list[str], say=print) -> TlsFiles:
    """The TLS files in ``tls_dir``: made (private CA + server certificate for ``ips``) when
    none of them exist; checked when they do (all three present, the certificate names every
    address in ``ips``). Raises ``TlsError`` naming the problem and the fix."""
    files = TlsFiles.in_dir(tls_dir)
    present = [p for p in (files.ca, files.cert, files.key) if p.exists()]
    if not present:
        _make(files, ips)
        say(
            f"made a private CA and a server certificate for {', '.join(ips)} in "
            f"{files.ca.parent} (valid {VALID_DAYS} days); clients need {files.ca}"
        )
        return files
    missing = [str(p) for p in (files.ca, files.cert, files.key) if not p.exists()]
    if missing:
        raise TlsError(
            f"buffer.tls_dir={tls_dir} lacks {', '.join(missing)}; give all of ca.crt, "
            "redis.crt and redis.key, or an empty directory to have them made"
        )
    _check_covers(files, ips)
    return files


def _check_covers(files: TlsFiles, ips: list[str]) -> None:
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
        named = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound) as e:
        raise TlsError(f"{files.cert} is not a PEM certificate with IP addresses: {e}") from None
    have = {str(ip) for ip in named.get_values_for_type(x509.IPAddress)}
    lacking = [ip for ip in ips if ip not in have]
    if lacking:
        raise TlsError(
            f"{files.cert} does not name {', '.join(lacking)} (it names {sorted(have) or 'no IP'})"
            "; clients would refuse it. Issue one for these addresses, or empty "
            f"{files.cert.parent} to have one made"
        )


def _make(files: TlsFiles, ips: list[str]) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=VALID_DAYS)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("asyncrl buffer CA"))
        .issuer_name(name("asyncrl buffer CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    sans = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    cert = (
        x509.CertificateBuilder()
        .subject_name(name("asyncrl redis"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    files.ca.parent.mkdir(parents=True, exist_ok=True)
    pem = serialization.Encoding.PEM
    for path, k in ((files.ca.with_name("ca.key"), ca_key), (files.key, key)):
        raw = k.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        write_atomic(path, raw, 0o600)
    write_atomic(files.ca, ca.public_bytes(pem), 0o644)
    write_atomic(files.cert, cert.public_bytes(pem), 0o644)
