"""``understudy group``: inspect a group, and the explicit human override.

Why this module exists: DESIGN says a group whose master and every slave are down stays
as it is, Degraded, until *a person* resolves it. ``group status`` shows what the
controller sees (state, each broker's liveness and published status, the leading
controller); ``group force-mode`` writes a new state with a new epoch, through the same
versioned write the controller uses, after :func:`~understudy_operator.controller.machine.plan_force`
has checked that it cannot give two brokers READ or rewind a consumer — and refuses with
an explanation when it could.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from understudy_broker.model import GroupState, Mode
from understudy_broker.zklayout import GroupConfig, LayoutError, check_name, config_path
from understudy_operator.cli.options import check_zk_connect, digest_option
from understudy_operator.controller.liveness import classify
from understudy_operator.controller.machine import ForceRefused, all_down, plan_force
from understudy_operator.controller.observe import Observation, ProcessState
from understudy_operator.local.procs import proc_state_letter, read_pid
from understudy_operator.zk import Digest, ZkError, ZkGateway, ZkUnavailable, with_gateway

T = TypeVar("T")


def _with_zk(connect: str, digest: Digest | None, work: Callable[[ZkGateway], Awaitable[T]]) -> T:
    """Run ``work`` with a gateway to ``connect``; ZooKeeper trouble becomes a CLI error."""
    try:
        return with_gateway(connect, work, timeout_s=5.0, digest=digest)
    except ZkUnavailable as exc:
        raise click.ClickException(f"cannot reach ZooKeeper at {connect}: {exc}") from exc
    except ZkError as exc:
        raise click.ClickException(f"ZooKeeper error: {exc!r}") from exc


def _process(pid_dir: Path | None, broker: str) -> ProcessState:
    if pid_dir is None:
        return ProcessState.UNKNOWN
    pid = read_pid(pid_dir, broker)
    return ProcessState.UNKNOWN if pid is None else classify(proc_state_letter(pid))


def _warn(message: str) -> None:
    click.echo(f"warning: {message}", err=True)


async def _read(zk: ZkGateway, group: str, pid_dir: Path | None
                ) -> tuple[GroupConfig, GroupState | None, int, Observation]:
    if await zk.get(config_path(group)) is None:
        raise click.ClickException(f"group {group!r} has no config in ZooKeeper")
    config = await zk.read_config(group, warn=_warn)
    if config is None:
        raise click.ClickException(f"group {group!r}: its config is malformed (see above)")
    state, version = await zk.read_state(
        group, warn=lambda msg: _warn(f"{msg}; force-mode can overwrite it"))
    obs = await zk.observe_group(group, [b.name for b in config.brokers],
                                 process=lambda name: _process(pid_dir, name), warn=_warn)
    return config, state, version, obs


def status_document(config: GroupConfig, state: GroupState | None, obs: Observation,
                    leader: str | None) -> dict[str, Any]:
    """The ``--json`` shape (also what the table shows)."""
    brokers = []
    for spec in config.brokers:
        v = obs.view(spec.name)
        st = v.status
        brokers.append({
            "name": spec.name,
            "role": spec.role.value,
            "configured": spec.permission.label,
            "live": v.zk_live,
            "process": v.process.value,
            "effective": st.effective.label if st else None,
            "epochApplied": st.epoch_applied if st else None,
            "masterLink": st.master_link if st else None,
            "maxOffset": st.max_offset if st else None,
            "ready": st.ready if st else None,
            "backSyncEpoch": st.backsync_epoch if st else None,
        })
    return {
        "group": config.group,
        "mode": state.mode.name if state else None,
        "epoch": state.epoch if state else None,
        "acting": state.acting if state else None,
        "since": state.since if state else None,
        "reason": state.reason if state else None,
        "degraded": all_down(config, obs),
        "inSync": sorted(obs.in_sync) if obs.in_sync is not None else None,
        "controller": leader,
        "brokers": brokers,
    }


_ZK = click.option("--zk", "connect", required=True, metavar="HOST:PORT[,HOST:PORT...][/CHROOT]",
                   callback=check_zk_connect, help="ZooKeeper connect string with the chroot.")
_GROUP = click.option("--group", required=True, metavar="G", help="The group.")
_PIDS = click.option("--pid-dir", type=click.Path(file_okay=False, path_type=Path),
                     help="Local mode: <broker>.pid files, to show and check process state.")


def _check_group(group: str) -> None:
    try:
        check_name("group", group)
    except LayoutError as exc:
        raise click.BadParameter(str(exc), param_hint="--group") from None


@click.group(short_help="Inspect a group and apply human overrides.",
             context_settings={"help_option_names": ["-h", "--help"]})
def group() -> None:
    """Inspect a group and apply human overrides."""


@group.command("status")
@_ZK
@_GROUP
@digest_option
@_PIDS
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def status_cmd(connect: str, group: str, digest: Digest | None, pid_dir: Path | None,
               as_json: bool) -> None:
    """Show the group's state, its brokers as the controller sees them, and the leader."""
    _check_group(group)

    async def work(zk: ZkGateway) -> dict[str, Any]:
        config, state, _, obs = await _read(zk, group, pid_dir)
        return status_document(config, state, obs, await zk.leader(group))

    doc = _with_zk(connect, digest, work)
    if as_json:
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
        return
    console = Console()
    head = (f"[bold]{doc['group']}[/]  mode [bold]{doc['mode']}[/]  epoch {doc['epoch']}  "
            f"acting {doc['acting'] or '-'}  controller {doc['controller'] or '[red]none[/]'}")
    if doc["degraded"]:
        head += "  [bold red]DEGRADED[/]"
    console.print(head)
    if doc["reason"]:
        console.print(f"reason: {doc['reason']}")
    table = Table()
    for col in ("broker", "role", "configured", "live", "process", "effective", "epoch",
                "master link", "offset", "ready", "back-sync epoch"):
        table.add_column(col)
    for b in doc["brokers"]:
        table.add_row(*(("-" if b[k] is None else str(b[k])) for k in (
            "name", "role", "configured", "live", "process", "effective", "epochApplied",
            "masterLink", "maxOffset", "ready", "backSyncEpoch")))
    console.print(table)


@group.command("force-mode")
@_ZK
@_GROUP
@digest_option
@_PIDS
@click.option("--mode", "mode_name", required=True,
              type=click.Choice([m.name for m in Mode], case_sensitive=False),
              help="The mode to write (with a new epoch).")
@click.option("--acting", metavar="BROKER", help="The acting slave (SLAVE_CONSUME, RECOVERING).")
@click.option("--reason", default="", help="Why; recorded in the state.")
@click.option("--accept-rewind", is_flag=True,
              help="Waive the consumer-offset checks (never the one-reader checks).")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def force_mode(connect: str, group: str, digest: Digest | None, pid_dir: Path | None,
               mode_name: str, acting: str | None, reason: str, accept_rewind: bool,
               yes: bool) -> None:
    """Write a group mode by hand, with a new epoch. Refuses anything that could give two
    brokers READ (force FENCING first), a SLAVE_CONSUME naming a broker that is not a live
    eligible slave, and NORMAL before the master persisted back-sync for this epoch."""
    _check_group(group)
    mode = Mode[mode_name.upper()]
    config, state, version, obs = _with_zk(connect, digest,
                                           lambda zk: _read(zk, group, pid_dir))
    if state is None:
        if version >= 0:  # the state node exists but is unreadable: outbid every
            # epoch a broker reports having applied, or the brokers would ignore us
            seen = [v.status.epoch_applied for v in obs.brokers.values() if v.status]
            state = GroupState(Mode.FENCING, max(seen, default=0))
        else:
            raise click.ClickException(
                f"group {group!r} has no state yet; start a controller to create it")
    try:
        new = plan_force(config, state, obs, mode=mode, acting=acting,
                         reason=reason or "by hand", accept_rewind=accept_rewind)
    except ForceRefused as exc:
        raise click.ClickException(f"refused: {exc}") from None
    summary = (f"{group}: {state.mode.name}/{state.epoch} -> {new.mode.name}/{new.epoch}"
               f" acting={new.acting or '-'}")
    if not yes and not click.confirm(f"{summary}. Write it?", err=True):
        raise click.ClickException("not confirmed; nothing written")
    # Versioned: if anyone moved the state since it was read (above, or while the person
    # was deciding), nothing is written.
    if not _with_zk(connect, digest, lambda zk: zk.write_state(group, new, version=version)):
        raise click.ClickException(
            "the state changed while you were deciding (the controller moved); nothing "
            "written: look at 'understudy group status' and run again")
    click.echo(f"wrote {summary}", file=sys.stdout)
