"""Options shared by the operator package's commands."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import click

from understudy_broker.model import parse_zk_connect
from understudy_operator.zk import Digest, parse_digest


def digest_option(func: Any) -> Any:
    """``--zk-digest USER:PASSWORD`` (also ``--digest``, its older name, and the environment
    variable ``UNDERSTUDY_ZK_DIGEST``) or ``--zk-digest-file FILE`` (a file holding
    ``USER:PASSWORD``, e.g. a mounted Secret: the password never appears in the process's
    arguments or environment): the ZooKeeper digest identity, parsed by the project's one
    parser (:func:`understudy_broker.zkclient.parse_digest`) and passed to the command as
    ``digest``."""

    @functools.wraps(func)
    def wrapper(*args: Any, digest_file: Path | None = None, **kwargs: Any) -> Any:
        if digest_file is not None:
            if kwargs.get("digest") is not None:
                raise click.UsageError("--zk-digest and --zk-digest-file: give one")
            kwargs["digest"] = read_digest_file(digest_file)
        return func(*args, **kwargs)

    wrapper = click.option(
        "--zk-digest-file", "digest_file", metavar="FILE", default=None,
        type=click.Path(dir_okay=False, path_type=Path),
        help="A file holding USER:PASSWORD (a mounted Secret), instead of --zk-digest.",
    )(wrapper)
    return click.option(
        "--zk-digest", "--digest", "digest", metavar="USER:PASSWORD",
        envvar="UNDERSTUDY_ZK_DIGEST", callback=_parse_digest,
        help="ZooKeeper digest credentials (env UNDERSTUDY_ZK_DIGEST).")(wrapper)


def read_digest_file(path: Path) -> Digest:
    """``USER:PASSWORD`` from ``path`` (a trailing newline is ignored); a usage error that
    names the file, never its content, when it cannot be used."""
    try:
        text = path.read_text(encoding="utf-8").rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"cannot read {path}: {exc.__class__.__name__}",
                                 param_hint="--zk-digest-file") from None
    try:
        return parse_digest(text)
    except ValueError as exc:
        raise click.BadParameter(f"{path}: {exc}", param_hint="--zk-digest-file") from None


def _parse_digest(_ctx: click.Context, param: click.Parameter, value: str | None
                  ) -> Digest | None:
    if value is None:
        return None
    try:
        return parse_digest(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param=param) from None


def check_zk_connect(_ctx: click.Context, param: click.Parameter, value: str | None
                     ) -> str | None:
    """A ``--zk`` callback: the connect string as given, once it passes the rules of
    every ``--zk`` (:func:`understudy_broker.model.parse_zk_connect`); a usage error (exit
    2) naming what is wrong otherwise, instead of kazoo's traceback or a connection that
    never comes up."""
    if value is None:
        return None
    try:
        parse_zk_connect(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param=param) from None
    return value
