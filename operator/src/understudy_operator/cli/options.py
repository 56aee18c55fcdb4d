"""Options shared by the operator package's commands."""

from __future__ import annotations

from typing import Any

import click

from understudy_operator.zk import Digest, parse_digest


def digest_option(func: Any) -> Any:
    """``--zk-digest USER:PASSWORD`` (also ``--digest``, its older name, and the environment
    variable ``UNDERSTUDY_ZK_DIGEST``): the ZooKeeper digest identity, parsed by the
    project's one parser (:func:`understudy_broker.zkclient.parse_digest`)."""
    return click.option(
        "--zk-digest", "--digest", "digest", metavar="USER:PASSWORD",
        envvar="UNDERSTUDY_ZK_DIGEST", callback=_parse_digest,
        help="ZooKeeper digest credentials (env UNDERSTUDY_ZK_DIGEST).")(func)


def _parse_digest(_ctx: click.Context, param: click.Parameter, value: str | None
                  ) -> Digest | None:
    if value is None:
        return None
    try:
        return parse_digest(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param=param) from None
