"""The progress server's certificate: self-managed in a Secret, or mounted by cert-manager.

Self-managed: one Secret in the operator's namespace holds a CA (10 years) and a serving
certificate (1 year) for the progress Service's DNS names. Every replica calls
`ensure_certificate` at start: it creates the Secret when missing, reuses it while valid, and
re-issues the serving certificate under the *same* CA when it is close to expiry, so the CA
that running jobs were given keeps working. Replicas racing each other are settled by the API
server (create answers 409, replace with a resourceVersion answers 409): the loser re-reads.
The CA's own renewal (when under `renew_before` of its 10 years) makes a new CA, and jobs
started before it stop reaching the server: that is once a decade, and it is logged.

cert-manager mode: tls.crt, tls.key (and ca.crt, when the issuer has one) mounted in a
directory; `read_mounted` reads them, and the caller re-reads them to pick up a rotation.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import logging
import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("muralist.progress.tls")

CA_VALIDITY = datetime.timedelta(days=3650)
CERT_VALIDITY = datetime.timedelta(days=365)
RENEW_BEFORE = datetime.timedelta(days=30)
# Nodes' clocks differ: a certificate valid from "now" would be refused by a pod a little behind.
BACKDATE = datetime.timedelta(minutes=5)
CA_KEY = "ca.key"  # beside the kubernetes.io/tls keys, so any replica can re-issue under the same CA


@dataclass(frozen=True)
class TlsMaterial:
    cert_pem: bytes
    key_pem: bytes
    ca_pem: bytes | None  # what pods trust; None when a public issuer signed (the system store applies)
    not_after: datetime.datetime

    @property
    def fingerprint(self) -> str:
        """Changes when the certificate does: compare to decide whether to reload."""
        return hashlib.sha256(self.cert_pem).hexdigest()


def service_names(service: str, namespace: str) -> list[str]:
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def _san(names: list[str]) -> x509.SubjectAlternativeName:
    """DNS names, and IP addresses for names that are addresses (pods that reach the endpoint
    by IP, e.g. an operator outside the cluster)."""
    entries: list[x509.GeneralName] = []
    for n in names:
        ip = _ip(n)
        entries.append(x509.IPAddress(ip) if ip is not None else x509.DNSName(n))
    return x509.SubjectAlternativeName(entries)


def server_context(material: TlsMaterial, ctx: ssl.SSLContext | None = None) -> ssl.SSLContext:
    """An SSLContext serving this certificate; given `ctx`, its certificate is replaced (new
    connections get the new one, open ones keep theirs). `load_cert_chain` reads only files:
    they live for the call in a private temporary directory (the operator's root filesystem is
    read-only; /tmp is not)."""
    if ctx is None:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory(prefix="muralist-tls-") as tmp:
        cert, key = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
        cert.write_bytes(material.cert_pem)
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(material.key_pem)
        ctx.load_cert_chain(cert, key)
    return ctx


# -- issuing -----------------------------------------------------------------------------------


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def new_ca(now: datetime.datetime | None = None, validity: datetime.timedelta = CA_VALIDITY,
           common_name: str = "muralist progress CA") -> tuple[bytes, bytes]:
    """(ca cert PEM, ca key PEM). P-256: small, and the cheapest handshake for 1,000 pods."""
    now = now or _now()
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _cert_pem(cert), _key_pem(key)


def issue(names: list[str], ca_pem: bytes, ca_key_pem: bytes, now: datetime.datetime | None = None,
          validity: datetime.timedelta = CERT_VALIDITY) -> TlsMaterial:
    """A serving certificate for `names` (DNS), signed by the CA."""
    now = now or _now()
    ca = x509.load_pem_x509_certificate(ca_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    not_after = min(now + validity, ca.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(not_after)
        .add_extension(_san(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.public_key()), critical=False)  # type: ignore[arg-type]
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    return TlsMaterial(_cert_pem(cert), _key_pem(key), ca_pem, cert.not_valid_after_utc)


def problem(material: TlsMaterial, names: list[str], now: datetime.datetime | None = None,
            renew_before: datetime.timedelta = RENEW_BEFORE) -> str | None:
    """Why this serving certificate must be re-issued, or None when it is good."""
    now = now or _now()
    try:
        cert = x509.load_pem_x509_certificate(material.cert_pem)
        key = serialization.load_pem_private_key(material.key_pem, password=None)
    except ValueError as e:
        return f"unreadable certificate or key: {e}"
    if cert.not_valid_after_utc - now <= renew_before:
        return f"expires {cert.not_valid_after_utc.isoformat()}"
    if cert.not_valid_before_utc > now + BACKDATE:
        return f"not valid before {cert.not_valid_before_utc.isoformat()}"
    if cert.public_key() != key.public_key():
        return "key does not match the certificate"
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        sans = {*san.get_values_for_type(x509.DNSName), *(str(a) for a in san.get_values_for_type(x509.IPAddress))}
    except x509.ExtensionNotFound:
        sans = set()
    if missing := [n for n in names if (str(_ip(n)) if _ip(n) else n) not in sans]:
        return f"does not name {', '.join(missing)}"
    if material.ca_pem is not None:
        try:
            cert.verify_directly_issued_by(x509.load_pem_x509_certificate(material.ca_pem))
        except (ValueError, TypeError, InvalidSignature):
            return "not signed by the CA"
    return None


def _ca_problem(ca_pem: bytes, ca_key_pem: bytes, now: datetime.datetime,
                renew_before: datetime.timedelta) -> str | None:
    try:
        ca = x509.load_pem_x509_certificate(ca_pem)
        key = serialization.load_pem_private_key(ca_key_pem, password=None)
    except ValueError as e:
        return f"unreadable CA: {e}"
    if ca.public_key() != key.public_key():
        return "CA key does not match the CA certificate"
    if ca.not_valid_after_utc - now <= renew_before:
        return f"CA expires {ca.not_valid_after_utc.isoformat()}"
    return None


# -- the Secret --------------------------------------------------------------------------------


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def _secret_body(name: str, material: TlsMaterial, ca_key_pem: bytes, resource_version: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {"app.kubernetes.io/component": "progress-tls"}}
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "type": "kubernetes.io/tls",
        "data": {"tls.crt": _b64(material.cert_pem), "tls.key": _b64(material.key_pem),
                 "ca.crt": _b64(material.ca_pem or b""), CA_KEY: _b64(ca_key_pem)},
    }


def ensure_certificate(
    core_v1: Any,
    namespace: str,
    secret_name: str,
    service: str,
    now: datetime.datetime | None = None,
    renew_before: datetime.timedelta = RENEW_BEFORE,
    attempts: int = 5,
    extra_names: list[str] | tuple[str, ...] = (),
) -> TlsMaterial:
    """The serving certificate for Service `service` in `namespace` (and `extra_names`: DNS names
    or IP addresses), from (or into) the Secret. A certificate that does not name them all is
    re-issued under the same CA."""
    names = service_names(service, namespace)
    names += [n for n in extra_names if n not in names]
    for _ in range(attempts):
        moment = now or _now()
        try:
            secret = core_v1.read_namespaced_secret(secret_name, namespace)
        except ApiException as e:
            if e.status != 404:
                raise
            ca_pem, ca_key_pem = new_ca(moment)
            material = issue(names, ca_pem, ca_key_pem, moment)
            try:
                core_v1.create_namespaced_secret(namespace, _secret_body(secret_name, material, ca_key_pem, None))
            except ApiException as e2:
                if e2.status == 409:
                    continue  # another replica was first: use its certificate
                raise
            log.info("created the progress CA and certificate in Secret %s/%s", namespace, secret_name)
            return material
        data = {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}
        current = TlsMaterial(data.get("tls.crt", b""), data.get("tls.key", b""), data.get("ca.crt") or None,
                              moment)
        why = problem(current, names, moment, renew_before) if current.cert_pem else "no certificate"
        if why is None:
            cert = x509.load_pem_x509_certificate(current.cert_pem)
            return TlsMaterial(current.cert_pem, current.key_pem, current.ca_pem, cert.not_valid_after_utc)
        ca_pem, ca_key_pem = data.get("ca.crt", b""), data.get(CA_KEY, b"")
        ca_why = _ca_problem(ca_pem, ca_key_pem, moment, renew_before) if ca_pem and ca_key_pem else "no CA"
        if ca_why is not None:
            log.warning("making a new progress CA (%s): jobs started before it cannot post progress", ca_why)
            ca_pem, ca_key_pem = new_ca(moment)
        material = issue(names, ca_pem, ca_key_pem, moment)
        try:
            version = secret.metadata.resource_version
            core_v1.replace_namespaced_secret(secret_name, namespace,
                                              _secret_body(secret_name, material, ca_key_pem, version))
        except ApiException as e:
            if e.status in (404, 409):
                continue  # changed or deleted under us: look again
            raise
        log.info("re-issued the progress certificate in Secret %s/%s (%s)", namespace, secret_name, why)
        return material
    raise RuntimeError(f"Secret {namespace}/{secret_name} kept changing; gave up after {attempts} attempts")


def read_mounted(directory: str | os.PathLike[str]) -> TlsMaterial:
    """cert-manager mode: the files of a mounted kubernetes.io/tls Secret."""
    base = Path(directory)
    cert_pem, key_pem = (base / "tls.crt").read_bytes(), (base / "tls.key").read_bytes()
    ca_file = base / "ca.crt"
    ca_pem = ca_file.read_bytes() if ca_file.is_file() and ca_file.stat().st_size else None
    cert = x509.load_pem_x509_certificate(cert_pem)
    return TlsMaterial(cert_pem, key_pem, ca_pem, cert.not_valid_after_utc)
