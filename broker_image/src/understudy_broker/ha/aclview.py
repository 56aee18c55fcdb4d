"""Users and ACL rules as ZooKeeper holds them (``/acl``), for one broker.

Why this module exists: every broker of every group, the acting slave included, must
decide a request exactly as the others do, from the same documents (DESIGN "Security").
Rules are read on every request and users' SCRAM keys at every authentication, so both
are kept in memory by watches on ``/acl/rules`` and ``/acl/users``. What the watches do
not hold yet is read from ZooKeeper after a ``sync``: a refusal is checked once more, and
an unknown user looked up, so a rule or user added through another broker a moment ago
is not refused for a notification's delay. Writes (SECURITY_ADMIN) are versioned read-modify-writes, retried on a
conflict, and create nodes with the broker's digest ACL, so only the cluster's own
identity can read the salted keys.

Threading as in :mod:`.clusterview`: kazoo's watch functions hand data to the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Iterable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from understudy_broker.acl import AclError, Rule, RulesDoc, UserDoc, check_user
from understudy_broker.protocol import SecurityAdminRequest, SecurityAdminResponse
from understudy_broker.zklayout import ACL_RULES, ACL_USERS, acl_rules_path, acl_user_path

log = logging.getLogger(__name__)


class AclView:
    """``/acl/rules/*`` and ``/acl/users/*`` by watches; SECURITY_ADMIN's writes."""

    def __init__(self, client: KazooClient, loop: asyncio.AbstractEventLoop,
                 acl: Any = None) -> None:
        self._client = client
        self._loop = loop
        self._acl = acl
        self._rules: dict[str, tuple[Rule, ...]] = {}
        self._users: dict[str, UserDoc | None] = {}  # None: malformed (logged)
        self._watched: dict[str, set[str]] = {ACL_RULES: set(), ACL_USERS: set()}

    async def start(self) -> None:
        for path in (ACL_USERS, ACL_RULES):
            await asyncio.to_thread(self._client.ensure_path, path, self._acl)
            await asyncio.to_thread(self._client.ChildrenWatch, path,
                                    self._kz(lambda names, d=path: self._names(d, names)))

    # ------------------------------------------------------------------ watches

    def _kz(self, apply: Callable[..., Any]) -> Callable[..., None]:
        def fired(*args: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed
                self._loop.call_soon_threadsafe(apply, *args)
        return fired

    def _names(self, parent: str, names: list[str]) -> None:
        watched = self._watched[parent]
        for name in names:
            if name not in watched:
                watched.add(name)
                fut = self._loop.run_in_executor(None, self._client.DataWatch,
                                                 f"{parent}/{name}", self._doc_watch(parent, name))
                fut.add_done_callback(_log_failure)
        held: dict[str, Any] = self._rules if parent == ACL_RULES else self._users
        for gone in set(held) - set(names):
            held.pop(gone, None)

    def _doc_watch(self, parent: str, name: str) -> Callable[..., Any]:
        def fired(data: bytes | None, *_: Any) -> bool:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._apply, parent, name, data)
            return data is not None
        return fired

    def _apply(self, parent: str, name: str, data: bytes | None) -> None:
        held: dict[str, Any] = self._rules if parent == ACL_RULES else self._users
        if data is None:
            held.pop(name, None)
            self._watched[parent].discard(name)
            return
        held[name] = _parse_rules(name, data) if parent == ACL_RULES else _parse_user(name, data)

    # ------------------------------------------------------------------ reads

    def rules_of(self, user: str) -> tuple[Rule, ...]:
        """The user's rules as the watch last delivered them."""
        return self._rules.get(user, ())

    async def _read_now(self, path: str) -> bytes | None:
        """A node's data as ZooKeeper holds it now (after a ``sync``); None: no node."""
        def read() -> bytes | None:
            self._client.sync(path)
            try:
                return bytes(self._client.get(path)[0])
            except NoNodeError:
                return None

        return await asyncio.to_thread(read)

    async def fresh_rules(self, user: str) -> tuple[Rule, ...]:
        """The user's rules as ZooKeeper holds them now (after a ``sync``)."""
        data = await self._read_now(acl_rules_path(user))
        return () if data is None else _parse_rules(user, data)

    async def user(self, user: str) -> UserDoc | None:
        """The user's stored credentials (None: no such user): as the watch delivered
        them, else from ZooKeeper itself (a user created a moment ago through another
        broker)."""
        if user in self._users:
            return self._users[user]
        data = await self._read_now(acl_user_path(user))
        return None if data is None else _parse_user(user, data)

    async def users(self) -> list[dict[str, Any]]:
        """Every user with credentials or rules: ``{user, mechanisms, rules}``."""
        def read() -> list[dict[str, Any]]:
            out: dict[str, dict[str, Any]] = {}
            for parent in (ACL_USERS, ACL_RULES):
                self._client.sync(parent)
            for name in self._client.get_children(ACL_USERS):
                try:
                    doc = UserDoc.from_json(bytes(self._client.get(f"{ACL_USERS}/{name}")[0]))
                    mechs = sorted(doc.scram)
                except (NoNodeError, AclError):
                    mechs = []
                out[name] = {"user": name, "mechanisms": mechs, "rules": []}
            for name in self._client.get_children(ACL_RULES):
                try:
                    rules = _parse_rules(name, bytes(self._client.get(f"{ACL_RULES}/{name}")[0]))
                except NoNodeError:
                    continue
                out.setdefault(name, {"user": name, "mechanisms": [], "rules": []})
                out[name]["rules"] = [r.to_dict() for r in rules]
            return [out[n] for n in sorted(out)]

        return await asyncio.to_thread(read)

    # ------------------------------------------------------------------ writes

    async def put_user(self, user: str, doc: UserDoc) -> bool:
        """Create or replace the user's credentials; True when the user is new."""
        path, data = acl_user_path(user), doc.to_json()

        def write() -> bool:
            try:
                self._client.create(path, data, acl=self._acl)
                return True
            except NodeExistsError:
                self._client.set(path, data)
                return False

        return await asyncio.to_thread(write)

    async def delete_user(self, user: str) -> bool:
        """Delete the user's credentials and rules; True when anything was there."""
        paths = (acl_user_path(user), acl_rules_path(user))

        def delete() -> bool:
            gone = False
            for path in paths:
                with contextlib.suppress(NoNodeError):
                    self._client.delete(path)
                    gone = True
            return gone

        return await asyncio.to_thread(delete)

    async def change_rules(self, user: str, change: Callable[[RulesDoc], RulesDoc]) -> bool:
        """Apply ``change`` to the user's rules by a versioned write (retried on a
        conflict); True when the rules changed. The last rule removed deletes the node."""
        path = acl_rules_path(user)

        def write() -> bool:
            while True:
                try:
                    data, stat = self._client.get(path)
                    old, version = RulesDoc.from_json(bytes(data)), stat.version
                except NoNodeError:
                    old, version = RulesDoc(), None
                new = change(old)
                if new == old:
                    return False
                try:
                    if version is None:
                        self._client.create(path, new.to_json(), acl=self._acl)
                    elif not new.rules:
                        self._client.delete(path, version=version)
                    else:
                        self._client.set(path, new.to_json(), version=version)
                    return True
                except (BadVersionError, NodeExistsError, NoNodeError):
                    continue  # changed meanwhile: read again

        return await asyncio.to_thread(write)


def rule_change(add: Iterable[Rule] = (), remove: Iterable[Rule] = ()
                ) -> Callable[[RulesDoc], RulesDoc]:
    adding, removing = list(add), list(remove)
    return lambda doc: doc.adding(adding).removing(removing)


async def admin_security(acls: AclView, req: SecurityAdminRequest) -> bytes:
    """A SECURITY_ADMIN request's answer (the caller checked the ACL); ``AclError`` for a
    malformed user, credential or rule (nothing written)."""
    if req.action in ("user-list", "acl-list"):
        users = await acls.users()
        if req.user is not None:
            users = [u for u in users if u["user"] == req.user]
        if req.action == "acl-list":
            users = [u for u in users if u["rules"]]
        return SecurityAdminResponse(users).encode()
    if req.user is None:
        raise AclError(f"{req.action} needs a user")
    check_user(req.user)
    if req.action == "user-create":
        if req.credentials is None:
            raise AclError("user-create needs the user's salted credentials")
        doc = UserDoc.from_json(json.dumps(req.credentials).encode())
        if not doc.scram:
            raise AclError("user-create: no SCRAM credentials")
        return SecurityAdminResponse([{"user": req.user, "mechanisms": sorted(doc.scram)}],
                                     await acls.put_user(req.user, doc)).encode()
    if req.action == "user-delete":
        return SecurityAdminResponse([{"user": req.user}],
                                     await acls.delete_user(req.user)).encode()
    rules = [Rule.from_dict(r) for r in req.rules]
    if not rules:
        raise AclError(f"{req.action} needs at least one rule")
    change = rule_change(add=rules) if req.action == "acl-add" else rule_change(remove=rules)
    changed = await acls.change_rules(req.user, change)
    return SecurityAdminResponse([{"user": req.user, "rules": [r.to_dict() for r in rules]}],
                                 changed).encode()


def _parse_rules(user: str, data: bytes) -> tuple[Rule, ...]:
    try:
        return RulesDoc.from_json(data).rules
    except AclError as exc:
        # Nothing is granted from a document nobody can read: refused, loudly.
        log.error("ignoring malformed ACL rules of user %s: %s", user, exc)
        return ()


def _parse_user(user: str, data: bytes) -> UserDoc | None:
    try:
        return UserDoc.from_json(data)
    except AclError as exc:
        log.error("user %s has malformed credentials in ZooKeeper: %s", user, exc)
        return None


def _log_failure(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.warning("arming an ACL watch failed: %r", fut.exception())
