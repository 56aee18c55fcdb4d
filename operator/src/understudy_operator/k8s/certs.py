"""The operator's certificate authority: issuing, renewing and reading certificates, pure.

Why this module exists: on Kubernetes every broker port speaks TLS by default, so the operator
runs a small certificate authority of its own (as Strimzi does): a CA kept in a Secret,
a server-and-client certificate per broker pod, and a client certificate per ``tls``
BrokerUser. Issuing and renewing are computations over PEM bytes and a clock passed in —
no Kubernetes, no files — so the handlers only move the bytes, and every decision (is this
certificate due? was it issued by this CA's key? does it name the pod's Services?) is unit
tested here with fixed clocks.

Choices worth knowing:

* Keys are ECDSA P-256 with SHA-256 signatures: small, fast to make, and accepted by every
  TLS 1.2+/1.3 stack the brokers and clients use (Python's ``ssl``/OpenSSL).
* *Renewing* the CA certificate keeps its key and its subject (:func:`renew_ca`). A
  certificate issued under the old CA certificate still verifies against the new one (the
  issuer name and the key that signed it are the same), so a renewal never breaks a
  connection between a broker restarted with the new CA and one that still holds the old.
  Replacing the CA *key* is a separate, two-step procedure (``k8s/security.py:plan_ca``).
* Subject and authority key identifiers are derived from the public keys, so "issued by
  this CA" (:func:`issued_by`) is a question about keys, not about one CA certificate.
* A leaf certificate never outlives the CA certificate that issued it, and starts five
  minutes in the past (clock skew between nodes).
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_COMMON_NAME: Final = "understudy-ca"
#: The common name of every broker certificate. Brokers present it as a client
#: certificate to each other's client ports and are started with
#: ``--super-user understudy-broker``, so no BrokerUser may take this name.
BROKER_COMMON_NAME: Final = "understudy-broker"
BACKDATE: Final = timedelta(minutes=5)
_PEM_BEGIN: Final = b"-----BEGIN CERTIFICATE-----"
_PEM_END: Final = b"-----END CERTIFICATE-----"


class CertError(ValueError):
    """Unreadable PEM, a key that does not match its certificate, or a bad policy."""


@dataclass(frozen=True, slots=True)
class CertPolicy:
    """How long certificates live and how long before their end they are renewed."""

    ca_validity: timedelta = timedelta(days=5 * 365)
    ca_renew_before: timedelta = timedelta(days=180)
    cert_validity: timedelta = timedelta(days=365)
    cert_renew_before: timedelta = timedelta(days=30)

    def __post_init__(self) -> None:
        if not timedelta(0) < self.ca_renew_before < self.ca_validity:
            raise CertError("the CA renewal window must be shorter than the CA's validity")
        if not timedelta(0) < self.cert_renew_before < self.cert_validity:
            raise CertError("the certificate renewal window must be shorter than its validity")
        if self.cert_renew_before >= self.ca_renew_before:
            # A leaf is capped at its CA's end; it must be renewed after the CA was.
            raise CertError("certificates must be renewed later than the CA "
                            "(cert_renew_before < ca_renew_before)")


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A certificate and its private key, both PEM."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def info(self) -> CertInfo:
        return inspect(self.cert_pem)


@dataclass(frozen=True, slots=True)
class CertInfo:
    """What the operator's decisions read from a certificate."""

    common_name: str
    dns_names: tuple[str, ...]
    not_before: datetime
    not_after: datetime
    serial: int
    is_ca: bool
    server_auth: bool
    client_auth: bool
    subject_key_id: bytes
    authority_key_id: bytes | None
    fingerprint: str
    """SHA-256 of the DER certificate, hex."""


def needs_renewal(not_after: datetime, now: datetime, renew_before: timedelta) -> bool:
    """Whether a certificate that ends at ``not_after`` is due: ``now`` is inside the
    ``renew_before`` window before its end (or past it)."""
    return now >= not_after - renew_before


PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
PublicKey = ec.EllipticCurvePublicKey | rsa.RSAPublicKey


def _key_id(public: PublicKey) -> bytes:
    return x509.SubjectKeyIdentifier.from_public_key(public).digest


def _private(key_pem: bytes) -> PrivateKey:
    """An ECDSA or RSA private key (the operator makes ECDSA keys; a CA brought by a person
    may be RSA)."""
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise CertError(f"unreadable private key: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise CertError("a CA key must be ECDSA or RSA")
    return key


def _load(cert_pem: bytes) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(cert_pem)
    except ValueError as exc:
        raise CertError(f"unreadable certificate: {exc}") from None


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "understudy"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _ca_certificate(key: PrivateKey, subject: x509.Name, *, now: datetime,
                    validity: timedelta) -> bytes:
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


def new_ca(*, now: datetime, validity: timedelta, common_name: str = CA_COMMON_NAME) -> KeyPair:
    """A fresh self-signed CA (a new key)."""
    key = _new_key()
    return KeyPair(_ca_certificate(key, _name(common_name), now=now, validity=validity),
                   _key_pem(key))


def renew_ca(ca: KeyPair, *, now: datetime, validity: timedelta) -> KeyPair:
    """The CA certificate again, with the same key and subject and new dates: what it
    issued stays valid under it (module docstring)."""
    key = _private(ca.key_pem)
    subject = _load(ca.cert_pem).subject
    return KeyPair(_ca_certificate(key, subject, now=now, validity=validity), ca.key_pem)


def issue(ca: KeyPair, *, common_name: str, dns_names: Sequence[str] = (), server: bool,
          client: bool, now: datetime, validity: timedelta,
          ip_addresses: Sequence[str] = ()) -> KeyPair:
    """A leaf certificate (new key) signed by ``ca``: ``server`` adds serverAuth, ``client``
    clientAuth; ``dns_names`` and ``ip_addresses`` (a local cluster's 127.0.0.1) become
    subjectAltNames. Ends at ``now + validity`` or at the CA certificate's end, whichever
    is first."""
    if not server and not client:
        raise CertError("a certificate needs serverAuth, clientAuth or both")
    ca_key = _private(ca.key_pem)
    ca_cert = _load(ca.cert_pem)
    if _key_id(ca_key.public_key()) != _key_id(_public(ca_cert)):
        raise CertError("the CA key does not match the CA certificate")
    key = _new_key()
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + (
        [ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
    end = min(now + validity, ca_cert.not_valid_after_utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False,
                                     key_cert_sign=False, crl_sign=False,
                                     content_commitment=False, data_encipherment=False,
                                     key_agreement=True, encipher_only=False,
                                     decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
    )
    if dns_names or ip_addresses:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName(n) for n in dns_names]
            + [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]),
            critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _public(cert: x509.Certificate) -> PublicKey:
    public = cert.public_key()
    if not isinstance(public, ec.EllipticCurvePublicKey | rsa.RSAPublicKey):
        raise CertError("not an ECDSA or RSA certificate")
    return public


def inspect(cert_pem: bytes) -> CertInfo:
    """The fields the decisions use; :class:`CertError` if it is not a certificate."""
    cert = _load(cert_pem)
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    try:
        sans = tuple(str(n) for n in cert.extensions.get_extension_for_class(
            x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        sans = ()
    try:
        eku = set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    except x509.ExtensionNotFound:
        eku = set()
    try:
        is_ca = bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        is_ca = False
    try:
        aki = cert.extensions.get_extension_for_class(
            x509.AuthorityKeyIdentifier).value.key_identifier
    except x509.ExtensionNotFound:
        aki = None
    try:
        ski = _key_id(_public(cert))
    except (CertError, ValueError):
        ski = b""
    der = cert.public_bytes(serialization.Encoding.DER)
    return CertInfo(
        common_name=str(cns[0].value) if cns else "",
        dns_names=sans,
        not_before=cert.not_valid_before_utc,
        not_after=cert.not_valid_after_utc,
        serial=cert.serial_number,
        is_ca=is_ca,
        server_auth=ExtendedKeyUsageOID.SERVER_AUTH in eku,
        client_auth=ExtendedKeyUsageOID.CLIENT_AUTH in eku,
        subject_key_id=ski,
        authority_key_id=aki,
        fingerprint=hashlib.sha256(der).hexdigest(),
    )


def issued_by(cert: CertInfo, ca: CertInfo) -> bool:
    """Whether ``cert`` names ``ca``'s key as its issuer's (survives a CA renewal)."""
    return cert.authority_key_id is not None and cert.authority_key_id == ca.subject_key_id


def verify_signature(cert_pem: bytes, ca_cert_pem: bytes) -> bool:
    """Whether ``ca_cert_pem``'s key really signed ``cert_pem`` (not only names it)."""
    cert, ca = _load(cert_pem), _load(ca_cert_pem)
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def key_matches(pair: KeyPair) -> bool:
    """Whether the private key belongs to the certificate."""
    try:
        return _key_id(_private(pair.key_pem).public_key()) == _key_id(
            _public(_load(pair.cert_pem)))
    except CertError:
        return False


def split_bundle(bundle: bytes) -> list[bytes]:
    """The PEM certificates of a bundle, each with its BEGIN/END lines and a newline."""
    out: list[bytes] = []
    rest = bundle
    while True:
        start = rest.find(_PEM_BEGIN)
        if start < 0:
            return out
        end = rest.find(_PEM_END, start)
        if end < 0:
            return out
        end += len(_PEM_END)
        out.append(rest[start:end].strip() + b"\n")
        rest = rest[end:]


def join_bundle(certs: Sequence[bytes]) -> bytes:
    """Certificates as one PEM bundle, each once, in the given order."""
    seen: list[bytes] = []
    for cert in certs:
        normal = cert.strip() + b"\n"
        if normal not in seen:
            seen.append(normal)
    return b"".join(seen)
