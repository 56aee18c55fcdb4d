"""The ``understudy`` command line.

Why this module exists: one console script fronts every part of the product (broker,
client tools, local cluster, drill, operator, SLA jobs). Subcommands are registered by
dotted path and imported only when invoked, so ``understudy broker`` never imports
PySpark or kopf, and a missing optional extra produces a clear message instead of a
traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any

import click

# name -> ("module:attribute", one-line help). The attribute is a click.Command/Group.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "broker": ("understudy_broker.cli_broker:broker", "Run a broker (master or slave)."),
    "produce": ("understudy_broker.cli_client:produce", "Produce messages to a topic."),
    "consume": ("understudy_broker.cli_client:consume", "Consume messages as a consumer group."),
    "topic": ("understudy_broker.cli_client:topic", "Create and inspect topics."),
    "local": ("understudy_operator.cli_local:local", "Run a cluster on this machine, no Kubernetes."),
    "group": ("understudy_operator.cli_group:group", "Inspect a group and apply human overrides."),
    "drill": ("understudy_operator.cli_drill:drill", "Failover drill with an invariant checker."),
    "workload": (
        "understudy_operator.cli_workload:workload",
        "Recorded traffic for a fixed time; writes a checker history.",
    ),
    "controller": ("understudy_operator.cli_controller:controller", "Run the failover controller."),
    "operator": ("understudy_operator.cli_operator:operator_cmd", "Run the Kubernetes operator (kopf)."),
    "sla": ("understudy_spark.cli:sla", "Failover SLA reports from Prometheus exports."),
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(n for n in SUBCOMMANDS if _available(n))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        spec = SUBCOMMANDS.get(cmd_name)
        if spec is None:
            return None
        module_name, attr = spec[0].split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            missing = exc.name or "?"
            if missing.startswith(module_name.split(".")[0]) and missing == module_name:
                return None
            raise click.ClickException(
                f"'understudy {cmd_name}' needs the Python package {missing!r}; "
                "install the project with its extras: pip install 'understudy[dev]'"
            ) from exc
        cmd = getattr(module, attr)
        if not isinstance(cmd, click.Command):  # pragma: no cover - programming error
            raise TypeError(f"{spec[0]} is not a click command")
        return cmd

    def format_commands(self, ctx: click.Context, formatter: Any) -> None:
        # Use the static one-line help so `--help` does not import every subcommand.
        rows = [(n, SUBCOMMANDS[n][1]) for n in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _available(name: str) -> bool:
    module_name = SUBCOMMANDS[name][0].split(":")[0]
    return importlib.util.find_spec(module_name) is not None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="understudy", prog_name="understudy")
def cli() -> None:
    """Understudy: broker groups that stay readable when the master dies, and bring the
    master back without rewinding a single consumer."""


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    cli.main(args=argv if argv is not None else sys.argv[1:], prog_name="understudy")
