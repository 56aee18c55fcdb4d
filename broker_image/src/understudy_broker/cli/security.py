"""``understudy user create|delete|list`` and ``understudy acl add|remove|list``.

Why this module exists: operators manage who may do what through any broker, like every
other admin call (clients never need ZooKeeper). A new user's password is salted and
hashed here (SCRAM, ``acl.make_user``): only the salted keys travel and are stored
(docs/security.md). Every command takes the client flags (``--bootstrap``, TLS, the
admin's own ``--user``/``--password-file``) and ``--json``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from understudy_broker import protocol as p
from understudy_broker.acl import (
    ALL,
    DEFAULT_ITERATIONS,
    MECHANISMS,
    AclError,
    Resource,
    check_user,
    make_user,
    parse_rule,
)
from understudy_broker.admin import security_admin
from understudy_broker.cli.client import _bootstrap, client_options
from understudy_broker.client import BrokerError
from understudy_broker.security import ClientSecurity, SecurityConfigError, read_secret

NEW_PASSWORD_ENV = "UNDERSTUDY_NEW_PASSWORD"


def _call(bootstrap: tuple[str, ...], security: ClientSecurity | None,
          req: p.SecurityAdminRequest) -> p.SecurityAdminResponse:
    try:
        return asyncio.run(security_admin(_bootstrap(bootstrap), req, security))
    except (BrokerError, ConnectionError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc


def _users_table(users: list[dict[str, Any]], *, rules: bool) -> None:
    table = Table()
    table.add_column("user")
    table.add_column("SCRAM" if not rules else "resource")
    if rules:
        table.add_column("operations")
    for u in users:
        if not rules:
            table.add_row(str(u["user"]), ", ".join(u.get("mechanisms", [])) or "-")
            continue
        for r in u.get("rules", []):
            table.add_row(str(u["user"]), f"{r['resource']}:{r['name']}",
                          ", ".join(r["operations"]))
    Console().print(table)


# ---------------------------------------------------------------------------- users


@click.group(short_help="Create, delete and list users (SCRAM credentials).",
             context_settings={"help_option_names": ["-h", "--help"]})
def user() -> None:
    """Users that authenticate with SCRAM-SHA-512/256 (their salted keys live in
    ZooKeeper; the password never leaves this command). A user who authenticates by
    client certificate needs no entry here, only ACLs (its name is the certificate's
    common name)."""


def _new_password(password_file: str | None) -> str:
    if password_file is not None:
        try:
            return read_secret(Path(password_file))
        except SecurityConfigError as exc:
            raise click.BadParameter(str(exc), param_hint="--new-password-file") from None
    env = os.environ.get(NEW_PASSWORD_ENV)
    if env:
        return env
    if sys.stdin.isatty():
        return str(click.prompt("new password", hide_input=True, confirmation_prompt=True))
    raise click.UsageError(f"give the new password with --new-password-file FILE (or "
                           f"{NEW_PASSWORD_ENV})")


@user.command("create")
@client_options
@click.argument("name")
@click.option("--new-password-file", default=None, metavar="FILE",
              help=f"The new user's password (else {NEW_PASSWORD_ENV}, else a prompt).")
@click.option("--iterations", type=click.IntRange(min=4096), default=DEFAULT_ITERATIONS,
              show_default=True, help="SCRAM iterations (hashing cost).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def user_create(bootstrap: tuple[str, ...], security: ClientSecurity | None, name: str,
                new_password_file: str | None, iterations: int, as_json: bool) -> None:
    """Create user NAME, or set a new password for it (the old one stops working for new
    connections; open ones stay authenticated until they close)."""
    try:
        check_user(name)
    except AclError as exc:
        raise click.BadParameter(str(exc), param_hint="NAME") from None
    doc = make_user(_new_password(new_password_file), iterations=iterations)
    resp = _call(bootstrap, security, p.SecurityAdminRequest(
        "user-create", name, json.loads(doc.to_json())))
    if as_json:
        click.echo(json.dumps({"user": name, "created": resp.changed,
                               "mechanisms": list(MECHANISMS)}))
        return
    click.echo(f"user {name}: {'created' if resp.changed else 'password changed'} "
               f"({', '.join(MECHANISMS)})")


@user.command("delete")
@client_options
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def user_delete(bootstrap: tuple[str, ...], security: ClientSecurity | None, name: str,
                as_json: bool) -> None:
    """Delete user NAME with its ACLs (its open connections stay until they close)."""
    resp = _call(bootstrap, security, p.SecurityAdminRequest("user-delete", name))
    if as_json:
        click.echo(json.dumps({"user": name, "deleted": resp.changed}))
        return
    click.echo(f"user {name}: {'deleted' if resp.changed else 'did not exist'}")


@user.command("list")
@client_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def user_list(bootstrap: tuple[str, ...], security: ClientSecurity | None,
              as_json: bool) -> None:
    """Every user with credentials or ACLs."""
    resp = _call(bootstrap, security, p.SecurityAdminRequest("user-list"))
    if as_json:
        click.echo(json.dumps({"users": list(resp.users)}))
        return
    _users_table([dict(u) for u in resp.users], rules=False)


@user.command("whoami")
@client_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def user_whoami(bootstrap: tuple[str, ...], security: ClientSecurity | None,
                as_json: bool) -> None:
    """Who the broker sees on this connection, and its ACLs."""
    resp = _call(bootstrap, security, p.SecurityAdminRequest("whoami"))
    me = dict(resp.users[0]) if resp.users else {}
    if as_json:
        click.echo(json.dumps(me))
        return
    click.echo(f"user {me.get('user') or '(anonymous)'} via {me.get('via') or '-'}"
               f"{' (super user)' if me.get('super_user') else ''}")


# ----------------------------------------------------------------------------- ACLs


@click.group(short_help="Add, remove and list ACLs.",
             context_settings={"help_option_names": ["-h", "--help"]})
def acl() -> None:
    """ACLs grant a user operations on topics, consumer groups or the cluster; what no
    ACL grants is refused with NOT_AUTHORIZED (docs/security.md). A name ending in '*'
    is a prefix; '*' alone is every name."""


def _rule_options(fn: Any) -> Any:
    for option in reversed((
        click.option("--principal", required=True, metavar="NAME",
                     help="The user the rule is for."),
        click.option("--topic", default=None, metavar="NAME", help="A topic (or prefix*)."),
        click.option("--group", "cgroup", default=None, metavar="NAME",
                     help="A consumer group (or prefix*)."),
        click.option("--cluster", is_flag=True, help="The cluster (topics admin, users)."),
        click.option("--operation", "operations", multiple=True, required=True,
                     metavar="OP",
                     help="topic: produce, consume, describe, admin; group: join, commit, "
                          f"describe; cluster: create, alter, delete, describe, security, "
                          f"broker; or {ALL} (repeatable or comma-separated)."),
        click.option("--json", "as_json", is_flag=True, help="Print one JSON object."),
    )):
        fn = option(fn)
    return fn


def _rule(principal: str, topic: str | None, cgroup: str | None, cluster: bool,
          operations: tuple[str, ...]) -> dict[str, Any]:
    given = [(Resource.TOPIC, topic), (Resource.GROUP, cgroup),
             (Resource.CLUSTER, "*" if cluster else None)]
    chosen = [(r, n) for r, n in given if n is not None]
    if len(chosen) != 1:
        raise click.UsageError("give exactly one of --topic, --group, --cluster")
    resource, name = chosen[0]
    ops = [o for part in operations for o in part.split(",") if o.strip()]
    try:
        check_user(principal)
        return parse_rule(resource.value, name, ops).to_dict()
    except AclError as exc:
        raise click.BadParameter(str(exc)) from None


def _rule_command(action: str, verb: str, doc: str) -> Any:
    """``acl add`` or ``acl remove``: one rule for one principal."""
    @client_options
    @_rule_options
    def command(bootstrap: tuple[str, ...], security: ClientSecurity | None, principal: str,
                topic: str | None, cgroup: str | None, cluster: bool,
                operations: tuple[str, ...], as_json: bool) -> None:
        rule = _rule(principal, topic, cgroup, cluster, operations)
        resp = _call(bootstrap, security,
                     p.SecurityAdminRequest(action, principal, rules=[rule]))
        _changed(verb, principal, rule, resp.changed, as_json)

    command.__doc__ = doc
    return command


acl_add = acl.command("add")(_rule_command(
    "acl-add", "added", "Grant PRINCIPAL operations on a topic, a consumer group or the cluster."))
acl_remove = acl.command("remove")(_rule_command(
    "acl-remove", "removed", "Remove a rule exactly as it was added."))


def _changed(verb: str, principal: str, rule: dict[str, Any], changed: bool,
             as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"principal": principal, "rule": rule, "changed": changed}))
        return
    what = f"{rule['resource']}:{rule['name']} {','.join(rule['operations'])}"
    click.echo(f"{principal}: {what} {verb if changed else 'unchanged (nothing to do)'}")


@acl.command("list")
@client_options
@click.option("--principal", default=None, metavar="NAME", help="Only this user's ACLs.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def acl_list(bootstrap: tuple[str, ...], security: ClientSecurity | None,
             principal: str | None, as_json: bool) -> None:
    """Every user's ACLs."""
    resp = _call(bootstrap, security, p.SecurityAdminRequest("acl-list", principal))
    if as_json:
        click.echo(json.dumps({"acls": [{"principal": u["user"], "rules": u["rules"]}
                                        for u in resp.users]}))
        return
    _users_table([dict(u) for u in resp.users], rules=True)
