"""The webhook's self-issued certificates, decided from what is stored and the time now.

A CA (ECDSA P-256, ten years) signs the serving certificate (one year, ``serverAuth``, the
Service's DNS names as SANs); the API server trusts the CA through the caBundle of the
ValidatingWebhookConfiguration. ``renew`` is the one decision: given what the Secret holds
(``Stored``, or None) and the time, what it should hold. A certificate is due when less than a
third of its lifetime is left, it does not parse, or (serving) its SANs miss a wanted name, its
key does not match or the current CA did not sign it. When the CA itself is due a new one is
issued and the old one stays in the bundle (old, then new) until it expires, so an API server
that still has only the old one keeps trusting us; the serving certificate is re-issued by the
new CA at once.

Owns: issuing (``issue_ca``, ``issue_serving``), the checks (``renewal_due``, ``key_matches``,
``issued_by``), the Service's names (``service_names``), the bundle (``ca_bundle``) and
``renew``. PEM bytes in and out.
Must not: read the clock, a file or the API (the keeper does): ``now`` is passed in, always
timezone-aware.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_NAME = "dra-gpu webhook CA"
CA_LIFETIME = datetime.timedelta(days=3650)
SERVING_LIFETIME = datetime.timedelta(days=365)
BACKDATE = datetime.timedelta(minutes=5)
"""Certificates start this long before ``now``: an API server whose clock is a little behind
still takes them."""
RENEW_WHEN_LEFT = 1 / 3
"""A certificate is due when less than this share of its lifetime is left."""


@dataclasses.dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key (PEM; the key PKCS#8, unencrypted)."""

    cert: bytes
    key: bytes


@dataclasses.dataclass(frozen=True)
class Stored:
    """What the Secret keeps (PEM), under the names of a ``kubernetes.io/tls`` Secret."""

    cert: bytes
    """``tls.crt``: the serving certificate."""
    key: bytes
    """``tls.key``: its key."""
    bundle: bytes
    """``ca.crt``: the CAs clients trust, oldest first; the current one is the last."""
    ca_key: bytes
    """``ca.key``: the current CA's key (its certificate is the one in ``bundle`` it matches)."""


def service_names(service: str, namespace: str) -> tuple[str, ...]:
    """The DNS names a client may use for ``service`` in ``namespace``; the API server uses
    ``<svc>.<ns>.svc``."""
    return (
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    )


def issue_ca(now: datetime.datetime, lifetime: datetime.timedelta = CA_LIFETIME) -> KeyPair:
    """A new self-signed CA that may sign serving certificates only (path length 0)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME)])
    cert = (
        _builder(name, name, key.public_key(), now, now + lifetime)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(signs_certificates=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(_cert_pem(cert), _key_pem(key))


def issue_serving(
    ca: KeyPair,
    names: Sequence[str],
    now: datetime.datetime,
    lifetime: datetime.timedelta = SERVING_LIFETIME,
) -> KeyPair:
    """A serving certificate for ``names`` (the first is its CN), signed by ``ca``; it never
    outlives the CA."""
    if not names:
        raise ValueError("a serving certificate needs at least one DNS name")
    ca_cert = x509.load_pem_x509_certificate(ca.cert)
    ca_key = serialization.load_pem_private_key(ca.key, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key is not an ECDSA key")
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    not_after = min(now + lifetime, ca_cert.not_valid_after_utc)
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        _builder(subject, ca_cert.subject, key.public_key(), now, not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(signs_certificates=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(name) for name in names]), critical=False
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return KeyPair(_cert_pem(cert), _key_pem(key))


def renewal_due(cert_pem: bytes, now: datetime.datetime, names: Sequence[str] = ()) -> bool:
    """Whether to issue ``cert_pem`` anew: less than a third of its lifetime is left, it does
    not parse, or its SANs do not cover every one of ``names``."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return True
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    if now >= end - (end - start) * RENEW_WHEN_LEFT:
        return True
    if not names:
        return False
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return True
    return not set(names) <= set(sans.get_values_for_type(x509.DNSName))


def key_matches(cert_pem: bytes, key_pem: bytes) -> bool:
    """Whether ``key_pem`` is the private key of ``cert_pem`` (False when either does not
    parse)."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        return False
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    return bool(
        key.public_key().public_bytes(serialization.Encoding.DER, public)
        == cert.public_key().public_bytes(serialization.Encoding.DER, public)
    )


def issued_by(cert_pem: bytes, ca_pem: bytes) -> bool:
    """Whether ``ca_pem`` signed ``cert_pem`` (False when either does not parse)."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        ca = x509.load_pem_x509_certificate(ca_pem)
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def ca_bundle(stored: Stored) -> bytes:
    """What goes into a webhook's ``clientConfig.caBundle`` (base64 of these PEM bytes in
    the JSON): every CA that clients should trust."""
    return stored.bundle


def renew(stored: Stored | None, names: Sequence[str], now: datetime.datetime) -> Stored:
    """What the Secret should hold at ``now`` for a Service reached by ``names``:
    ``stored`` itself when nothing is due, else what replaces it (see the module's
    docstring)."""
    if stored is None:
        ca = issue_ca(now)
        return _with_serving(ca, names, now, older=[])
    trusted = [cert for cert in _bundle_certs(stored.bundle) if now < cert.not_valid_after_utc]
    pems = [_cert_pem(cert) for cert in trusted]
    current = next((pem for pem in pems if key_matches(pem, stored.ca_key)), None)
    if current is None or renewal_due(current, now):
        # A new CA; the old ones stay trusted (first) until they expire.
        return _with_serving(issue_ca(now), names, now, older=pems)
    ca = KeyPair(current, stored.ca_key)
    serving = KeyPair(stored.cert, stored.key)
    if (
        renewal_due(stored.cert, now, names)
        or not key_matches(stored.cert, stored.key)
        or not issued_by(stored.cert, current)
    ):
        serving = issue_serving(ca, names, now)
    bundle = b"".join([pem for pem in pems if pem != current] + [current])
    renewed = Stored(serving.cert, serving.key, bundle, stored.ca_key)
    return stored if renewed == stored else renewed


def _with_serving(
    ca: KeyPair, names: Sequence[str], now: datetime.datetime, older: list[bytes]
) -> Stored:
    serving = issue_serving(ca, names, now)
    return Stored(serving.cert, serving.key, b"".join([*older, ca.cert]), ca.key)


def _bundle_certs(bundle: bytes) -> list[x509.Certificate]:
    """The certificates of a PEM bundle; none when it does not parse."""
    try:
        return x509.load_pem_x509_certificates(bundle)
    except ValueError:
        return []


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    now: datetime.datetime,
    not_after: datetime.datetime,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(not_after)
    )


def _key_usage(*, signs_certificates: bool) -> x509.KeyUsage:
    """Digital signatures (ECDSA: the TLS handshake); a CA's also signs certificates and CRLs."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        encipher_only=False,
        decipher_only=False,
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
