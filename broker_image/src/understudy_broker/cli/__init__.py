"""The ``understudy`` command line.

Why this module exists: one console script fronts every part of the product (broker,
client tools, local cluster, controller, operator, SLA jobs) and the verification harness
(drill, workload). Subcommands are not listed here: each package registers its own as an
``understudy.commands`` entry point (pyproject.toml), so this module imports none of them
and a package added later needs no edit here. A subcommand is imported only when invoked
(``understudy broker`` never imports PySpark or kopf), and a missing optional extra gives
a clear message instead of a traceback.
"""

from __future__ import annotations

import sys
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import click

ENTRY_POINT_GROUP = "understudy.commands"


@cache
def commands() -> dict[str, EntryPoint]:
    """The registered subcommands by name (read from the installed metadata, not imported)."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def load(name: str) -> click.Command:
    """Import and return one subcommand; :class:`click.ClickException` naming the missing
    package when an optional extra is not installed."""
    ep = commands()[name]
    try:
        cmd = ep.load()
    except ModuleNotFoundError as exc:
        raise click.ClickException(
            f"'understudy {name}' needs the Python package {exc.name or '?'!r}; "
            "install the project with its extras: pip install 'understudy[dev]'"
        ) from exc
    if not isinstance(cmd, click.Command):  # pragma: no cover - a packaging error
        raise TypeError(f"entry point {ep.value} is not a click command")
    return cmd


class LazyGroup(click.Group):
    """A click group whose subcommands are entry points imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(commands())

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return load(cmd_name) if cmd_name in commands() else None

    def format_commands(self, ctx: click.Context, formatter: Any) -> None:
        rows = []
        for name in self.list_commands(ctx):
            try:
                help_text = load(name).get_short_help_str(limit=70)
            except click.ClickException as exc:
                help_text = f"(unavailable: {exc.format_message()})"
            rows.append((name, help_text))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="understudy", prog_name="understudy")
def cli() -> None:
    """Understudy: broker groups that stay readable when the master dies, and bring the
    master back without rewinding a single consumer."""


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    cli.main(args=argv if argv is not None else sys.argv[1:], prog_name="understudy")
