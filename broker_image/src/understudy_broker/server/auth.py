"""Who is on a connection, and whether they may do what they ask (docs/security.md).

Why this module exists: every handler that touches a topic, a consumer group or the
cluster asks one :class:`Guard` with the connection's :class:`Session`, so the rules are
the same for every operation and on every broker (an acting slave decides exactly as its
master: both read the same ``/acl`` documents). A refusal is a ``RequestError`` raised
before the handler changes anything.

- A connection's user comes from a verified client certificate (its common name) or a
  SCRAM exchange (AUTHENTICATE, two steps, ``scramp`` doing the cryptography against the
  salted keys in ZooKeeper).
- With ``--require-auth``, an anonymous connection gets ``AUTHENTICATION_FAILED`` for
  anything but AUTHENTICATE, and every operation needs a rule (or a super user).
- Decisions go to the ``understudy.audit`` log as ``--audit`` says (denied by default).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from understudy_broker import protocol as p
from understudy_broker.acl import MECHANISMS, Resource, authorize, denied_message, topic_resource
from understudy_broker.config import SecurityConfig
from understudy_broker.ha.aclview import AclView
from understudy_broker.server.errors import RequestError

audit = logging.getLogger("understudy.audit")
log = logging.getLogger("understudy.broker")

_CLIENT_FIRST_USER = re.compile(r"^[nyp][^,]*,[^,]*,n=([^,]*),")


@dataclass(eq=False, slots=True)
class Session:
    """One client connection's identity. ``via``: ``certificate`` or the SCRAM
    mechanism; ``pending``: a SCRAM exchange between its two steps."""

    peer: str = ""
    user: str | None = None
    via: str = ""
    pending: Any = None
    pending_user: str | None = None

    @classmethod
    def of_certificate(cls, peer: str, user: str | None) -> Session:
        return cls(peer, user, "certificate" if user is not None else "")


#: A request from inside the broker process (tests, tools): no connection, no checks
#: beyond those the broker's configuration makes for everyone.
INTERNAL = Session("internal")


def scram_user(client_first: str) -> str:
    """The user a SCRAM client-first message names (RFC 5802 escapes ``=2C``/``=3D``)."""
    m = _CLIENT_FIRST_USER.match(client_first)
    if m is None:
        raise RequestError(p.Status.AUTHENTICATION_FAILED,
                           "not a SCRAM client-first message")
    return m.group(1).replace("=2C", ",").replace("=3D", "=")


class Guard:
    """The broker's authentication and authorisation decisions."""

    def __init__(self, sec: SecurityConfig, acls: Callable[[], AclView | None],
                 broker: str) -> None:
        self._sec = sec
        self._acls = acls
        self._broker = broker

    @property
    def enforcing(self) -> bool:
        return self._sec.require_auth

    def admit(self, session: Session, op: int) -> None:
        """With authentication required, only AUTHENTICATE before a user is known."""
        if (self._sec.require_auth and session.user is None and op != p.Op.AUTHENTICATE
                and session is not INTERNAL):
            raise RequestError(
                p.Status.AUTHENTICATION_FAILED,
                f"{self._broker} requires authentication: connect with --user and "
                "--password-file (SCRAM) or a client certificate (--tls-cert/--tls-key)")

    def is_super(self, session: Session) -> bool:
        return session.user is not None and session.user in self._sec.super_users

    async def require(self, session: Session, resource: Resource, name: str,
                      operation: str) -> None:
        """Raise ``NOT_AUTHORIZED`` unless the session's user may do ``operation``."""
        if not self._sec.require_auth or session is INTERNAL:
            return
        if resource is Resource.TOPIC:
            resource, name, operation = topic_resource(name, operation)
        if not await self.allowed(session, resource, name, operation):
            raise RequestError(p.Status.NOT_AUTHORIZED,
                               denied_message(session.user, resource, name, operation))

    async def allowed(self, session: Session, resource: Resource, name: str,
                      operation: str) -> bool:
        """The decision (audited); a refusal is checked once more against ZooKeeper
        itself, so a rule added through another broker a moment ago counts."""
        if not self._sec.require_auth or session is INTERNAL:
            return True
        user = session.user
        if user is None:
            return False
        acls = self._acls()
        rules = acls.rules_of(user) if acls is not None else ()
        decision = authorize(rules, user=user, super_user=self.is_super(session),
                             resource=resource, name=name, operation=operation)
        if not decision.allowed and acls is not None:
            decision = authorize(await acls.fresh_rules(user), user=user, super_user=False,
                                 resource=resource, name=name, operation=operation)
        if self._sec.audit == "all" or (self._sec.audit == "denied" and not decision.allowed):
            audit.info("%s user=%s via=%s peer=%s %s %s:%s (%s)",
                       "ALLOW" if decision.allowed else "DENY", user, session.via,
                       session.peer, operation, resource.value, name, decision.reason)
        return decision.allowed

    # ---- AUTHENTICATE -----------------------------------------------------------------

    async def authenticate(self, session: Session, req: p.AuthenticateRequest) -> bytes:
        """One SCRAM step: the client-first message, then the client-final one."""
        if session.user is not None and session.pending is None:
            raise RequestError(p.Status.BAD_REQUEST,
                               f"this connection is already authenticated as {session.user!r}")
        if req.mechanism not in MECHANISMS:
            raise RequestError(p.Status.AUTHENTICATION_FAILED,
                               f"mechanism {req.mechanism!r} is not offered; "
                               f"use one of {', '.join(MECHANISMS)}")
        # scramp (and the ASN.1 library under it) is imported on the first SCRAM exchange,
        # not at start: it is a sixth of a broker's start-up CPU, and most brokers run without.
        from scramp import ScramException, ScramMechanism

        if session.pending is None:
            named = scram_user(req.message)
            acls = self._acls()
            doc = None if acls is None else await acls.user(named)
            cred = None if doc is None else doc.scram.get(req.mechanism)
            if cred is None:
                self._audit_auth(session, named, False, "unknown user" if doc is None
                                 else f"no {req.mechanism} credentials")
                raise RequestError(
                    p.Status.AUTHENTICATION_FAILED,
                    f"unknown user {named!r}" if doc is None else
                    f"user {named!r} has no {req.mechanism} credentials")
            server = ScramMechanism(req.mechanism).make_server(
                lambda _u: (cred.salt, cred.stored_key, cred.server_key, cred.iterations))
            try:
                server.set_client_first(req.message)
            except ScramException as exc:
                raise RequestError(p.Status.AUTHENTICATION_FAILED,
                                   f"bad SCRAM client-first message: {exc}") from None
            session.pending, session.pending_user = server, named
            return p.AuthenticateResponse(server.get_server_first()).encode()
        server, user = session.pending, session.pending_user
        session.pending = session.pending_user = None
        try:
            server.set_client_final(req.message)
        except ScramException:
            self._audit_auth(session, user, False, "wrong password")
            raise RequestError(p.Status.AUTHENTICATION_FAILED,
                               f"wrong password for user {user!r}") from None
        session.user, session.via = user, req.mechanism
        self._audit_auth(session, user, True, req.mechanism)
        return p.AuthenticateResponse(server.get_server_final(), user).encode()

    def _audit_auth(self, session: Session, user: str | None, ok: bool, why: str) -> None:
        if self._sec.audit == "all" or (self._sec.audit == "denied" and not ok):
            audit.info("%s user=%s peer=%s authenticate (%s)",
                       "AUTHENTICATED" if ok else "AUTHENTICATION_FAILED", user,
                       session.peer, why)
