"""TLS contexts, certificate reloading, and what a client presents to a broker.

Why this module exists: the broker's client and replication ports, the client library,
the CLI and a broker talking to its peers all build TLS contexts and carry credentials;
one copy here keeps them alike (TLS 1.2 at least, 1.3 preferred by OpenSSL's order; a
verified client certificate's common name is its user) and keeps a password out of
every repr and log line (docs/security.md).
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from understudy_broker.config import SecurityConfig

log = logging.getLogger("understudy.security")

#: Read by the CLI when ``--password-file`` is not given.
PASSWORD_ENV: Final = "UNDERSTUDY_PASSWORD"
DEFAULT_MECHANISM: Final = "SCRAM-SHA-512"


class SecurityConfigError(ValueError):
    """A certificate, key or password file that cannot be used; the message says which."""


def _load_chain(ctx: ssl.SSLContext, cert: Path, key: Path) -> None:
    try:
        ctx.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as exc:
        raise SecurityConfigError(
            f"cannot load certificate {cert} with key {key}: {exc}") from exc


def _load_ca(ctx: ssl.SSLContext, ca: Path) -> None:
    try:
        ctx.load_verify_locations(str(ca))
    except (OSError, ssl.SSLError) as exc:
        raise SecurityConfigError(f"cannot load CA certificates from {ca}: {exc}") from exc


def server_context(cert: Path, key: Path, ca: Path | None, client_auth: str) -> ssl.SSLContext:
    """A listening port's context; ``client_auth`` ``none``/``optional``/``required``."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(ctx, cert, key)
    if ca is not None:
        _load_ca(ctx, ca)
    ctx.verify_mode = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL,
                       "required": ssl.CERT_REQUIRED}[client_auth if ca else "none"]
    return ctx


def client_context(ca: Path | None, cert: Path | None = None,
                   key: Path | None = None) -> ssl.SSLContext:
    """A client's context: the broker's certificate verified against ``ca`` (the system's
    CAs without it) and its name checked; ``cert``/``key``: a client certificate."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca is not None:
        _load_ca(ctx, ca)
    if cert is not None and key is not None:
        _load_chain(ctx, cert, key)
    return ctx


def certificate_user(ssl_object: Any) -> str | None:
    """The common name of a peer's verified certificate (None: it sent none)."""
    if ssl_object is None:
        return None
    peer = ssl_object.getpeercert()
    if not peer:
        return None
    for rdn in peer.get("subject", ()):
        for name, value in rdn:
            if name == "commonName":
                return str(value)
    return None


def tls_error_message(exc: BaseException, address: str) -> str:
    """What a person reads when a TLS handshake failed."""
    reason = getattr(exc, "reason", None) or getattr(exc, "verify_message", None) or str(exc)
    verify = getattr(exc, "verify_message", None)
    detail = f"{reason}" + (f" ({verify})" if verify and verify != reason else "")
    hint = ""
    text = str(exc).lower()
    if "certificate verify failed" in text or "certificate_verify_failed" in text:
        hint = ": the broker's certificate is not signed by --tls-ca, has expired, or " \
               "does not name the address"
    elif "certificate required" in text or "alert certificate required" in text:
        hint = ": the broker requires a client certificate (--tls-cert/--tls-key)"
    elif "unknown ca" in text or "bad certificate" in text or "expired" in text:
        hint = ": the broker refused this client's certificate (not signed by its CA, " \
               "or expired)"
    elif "wrong version number" in text or "record layer failure" in text:
        hint = ": the broker does not speak TLS on this port (drop --tls-ca?)"
    return f"TLS error with {address}: {detail}{hint}"


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    """What a client presents: TLS (``ssl``; a client certificate authenticates its common
    name) and a SCRAM user. The password never appears in a repr."""

    ssl: ssl.SSLContext | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    mechanism: str = DEFAULT_MECHANISM
    #: The context carries a client certificate (for error messages).
    client_certificate: bool = False

    @classmethod
    def from_files(cls, *, tls_ca: Path | None = None, tls_cert: Path | None = None,
                   tls_key: Path | None = None, user: str | None = None,
                   password_file: Path | None = None,
                   password_env: str = PASSWORD_ENV) -> ClientSecurity | None:
        """From the client flags (None when none is given): the password from
        ``password_file``, else from the environment variable ``password_env``."""
        if (tls_cert is None) != (tls_key is None):
            raise SecurityConfigError("--tls-cert and --tls-key go together")
        if password_file is not None and user is None:
            raise SecurityConfigError("--password-file needs --user")
        password = None
        if user is not None:
            password = read_secret(password_file) if password_file is not None else (
                os.environ.get(password_env))
            if not password:
                raise SecurityConfigError(
                    f"--user {user}: give its password with --password-file FILE "
                    f"(or the {password_env} environment variable)")
        ctx = None
        if tls_ca is not None or tls_cert is not None:
            ctx = client_context(tls_ca, tls_cert, tls_key)
        if ctx is None and user is None:
            return None
        return cls(ctx, user, password, client_certificate=tls_cert is not None)


def read_secret(path: Path) -> str:
    """A password or secret file's content without its trailing newline."""
    try:
        text = path.read_text(encoding="utf-8").rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise SecurityConfigError(f"cannot read {path}: {exc}") from exc
    if not text:
        raise SecurityConfigError(f"{path} is empty")
    return text


@dataclass(frozen=True, slots=True)
class BrokerTls:
    """A broker's TLS contexts, built once from its flags: the client port's, the
    replication port's (a slave must present a certificate of the CA when one is given),
    the HTTP port's, and the one it uses as a client of its peers (its replication link
    and their client ports; its own certificate is its client certificate)."""

    client_port: ssl.SSLContext | None = None
    replication: ssl.SSLContext | None = None
    http: ssl.SSLContext | None = None
    peer: ssl.SSLContext | None = None

    @classmethod
    def of(cls, sec: SecurityConfig) -> BrokerTls:
        if sec.tls_cert is None or sec.tls_key is None:
            return cls()
        cert, key, ca = sec.tls_cert, sec.tls_key, sec.tls_ca
        return cls(
            client_port=server_context(cert, key, ca, sec.tls_client_auth),
            replication=server_context(cert, key, ca, "required"),
            http=server_context(cert, key, None, "none") if sec.tls_http else None,
            peer=client_context(ca, cert, key))

    def contexts(self) -> list[ssl.SSLContext]:
        return [c for c in (self.client_port, self.replication, self.http, self.peer)
                if c is not None]

    def peer_security(self, sec: SecurityConfig) -> ClientSecurity | None:
        """What this broker presents to its peers' client ports."""
        if self.peer is None and sec.peer_user is None:
            return None
        return ClientSecurity(self.peer, sec.peer_user, sec.peer_password,
                              client_certificate=self.peer is not None)


class CertReloader:
    """Loads a context's certificate again when its files change (checked every
    ``interval_s``): new connections get the new certificate, open ones keep theirs. A
    file caught half-written (or a bad new pair) is logged and the old one kept."""

    def __init__(self, contexts: list[ssl.SSLContext], cert: Path, key: Path, *,
                 interval_s: float) -> None:
        self._contexts = contexts
        self._cert, self._key = cert, key
        self._interval_s = interval_s
        self._seen = self._stamp()
        self.reloads = 0
        self._task: asyncio.Task[None] | None = None

    def _stamp(self) -> tuple[int, int, int, int]:
        try:
            c, k = self._cert.stat(), self._key.stat()
        except OSError:
            return (0, 0, 0, 0)
        return (c.st_mtime_ns, c.st_size, k.st_mtime_ns, k.st_size)

    def check(self) -> bool:
        """Reload if the files changed; True when the new pair was loaded."""
        stamp = self._stamp()
        if stamp == self._seen:
            return False
        try:
            for ctx in self._contexts:
                _load_chain(ctx, self._cert, self._key)
        except SecurityConfigError as exc:
            log.error("keeping the current certificate: %s", exc)
            return False
        self._seen = stamp
        self.reloads += 1
        log.info("loaded the new certificate %s for new connections", self._cert)
        return True

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="tls-reload")

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            self.check()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
