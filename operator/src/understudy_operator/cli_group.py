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
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, KazooException, NoNodeError
from rich.console import Console
from rich.table import Table

from understudy_broker.model import GroupState, Mode
from understudy_broker.zklayout import (
    BrokerStatus,
    GroupConfig,
    LayoutError,
    check_name,
    config_path,
    controller_path,
    decode_state,
    encode_state,
    live_dir,
    state_path,
    status_path,
)
from understudy_operator.cli_controller import parse_digest
from understudy_operator.controller.driver import decode_isr, isr_path
from understudy_operator.controller.liveness import classify, proc_state_letter, read_pid_file
from understudy_operator.controller.machine import ForceRefused, all_down, plan_force
from understudy_operator.controller.observe import BrokerView, Observation, ProcessState


@contextmanager
def _zk(connect: str, digest: str | None) -> Iterator[KazooClient]:
    auth = parse_digest(digest)
    client = KazooClient(hosts=connect, timeout=5.0,
                         auth_data=[("digest", f"{auth[0]}:{auth[1]}")] if auth else None)
    try:
        client.start(timeout=10)
    except Exception as exc:  # kazoo raises its own timeout type
        client.close()
        raise click.ClickException(f"cannot reach ZooKeeper at {connect}: {exc}") from exc
    try:
        yield client
    except KazooException as exc:
        raise click.ClickException(f"ZooKeeper error: {exc!r}") from exc
    finally:
        client.stop()
        client.close()


def _process(pid_dir: Path | None, broker: str) -> ProcessState:
    if pid_dir is None:
        return ProcessState.UNKNOWN
    pid = read_pid_file(pid_dir / f"{broker}.pid")
    return ProcessState.UNKNOWN if pid is None else classify(proc_state_letter(pid))


def _read(client: KazooClient, group: str, pid_dir: Path | None
          ) -> tuple[GroupConfig, GroupState | None, int, Observation]:
    try:
        raw_cfg, _ = client.get(config_path(group))
    except NoNodeError:
        raise click.ClickException(f"group {group!r} has no config in ZooKeeper") from None
    try:
        config = GroupConfig.from_json(raw_cfg)
    except LayoutError as exc:
        raise click.ClickException(f"group {group!r}: {exc}") from None
    state: GroupState | None = None
    version = -1
    try:
        raw_state, stat = client.get(state_path(group))
        version = stat.version
        state = decode_state(raw_state)
    except NoNodeError:
        pass
    except LayoutError as exc:
        click.echo(f"warning: {exc}; force-mode can overwrite it", err=True)
    try:
        live = set(client.get_children(live_dir(group)))
    except NoNodeError:
        live = set()
    views: dict[str, BrokerView] = {}
    for spec in config.brokers:
        status: BrokerStatus | None = None
        sversion = -1
        try:
            raw, zstat = client.get(status_path(group, spec.name))
            sversion = zstat.version
            status = BrokerStatus.from_json(raw)
        except NoNodeError:
            pass
        except LayoutError as exc:
            click.echo(f"warning: {spec.name}: {exc}", err=True)
        views[spec.name] = BrokerView(spec.name, zk_live=spec.name in live,
                                      process=_process(pid_dir, spec.name), status=status,
                                      status_version=sversion)
    in_sync: frozenset[str] | None = None
    try:
        in_sync = decode_isr(client.get(isr_path(group))[0])
    except NoNodeError:
        pass
    except LayoutError as exc:
        click.echo(f"warning: {exc}; trusting no slave", err=True)
        in_sync = frozenset()
    obs = Observation(now=time.monotonic(), wall=time.time(), brokers=views, in_sync=in_sync)
    return config, state, version, obs


def _leader(client: KazooClient, group: str) -> str | None:
    try:
        children = sorted(client.get_children(controller_path(group)))
        if not children:
            return None
        data, _ = client.get(f"{controller_path(group)}/{children[0]}")
        return bytes(data).decode("utf-8", "replace")
    except NoNodeError:
        return None


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


_ZK = click.option("--zk", "connect", required=True, metavar="HOST:PORT[/CHROOT]",
                   help="ZooKeeper connect string with the chroot.")
_GROUP = click.option("--group", required=True, metavar="G", help="The group.")
_DIGEST = click.option("--digest", metavar="USER:PASSWORD", envvar="UNDERSTUDY_ZK_DIGEST",
                       help="ZooKeeper digest credentials (env UNDERSTUDY_ZK_DIGEST).")
_PIDS = click.option("--pid-dir", type=click.Path(file_okay=False, path_type=Path),
                     help="Local mode: <broker>.pid files, to show and check process state.")


def _check_group(group: str) -> None:
    try:
        check_name("group", group)
    except LayoutError as exc:
        raise click.BadParameter(str(exc), param_hint="--group") from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def group() -> None:
    """Inspect a group and apply human overrides."""


@group.command("status")
@_ZK
@_GROUP
@_DIGEST
@_PIDS
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def status_cmd(connect: str, group: str, digest: str | None, pid_dir: Path | None,
               as_json: bool) -> None:
    """Show the group's state, its brokers as the controller sees them, and the leader."""
    _check_group(group)
    with _zk(connect, digest) as client:
        config, state, _, obs = _read(client, group, pid_dir)
        doc = status_document(config, state, obs, _leader(client, group))
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
@_DIGEST
@_PIDS
@click.option("--mode", "mode_name", required=True,
              type=click.Choice([m.name for m in Mode], case_sensitive=False),
              help="The mode to write (with a new epoch).")
@click.option("--acting", metavar="BROKER", help="The acting slave (SLAVE_CONSUME, RECOVERING).")
@click.option("--reason", default="", help="Why; recorded in the state.")
@click.option("--accept-rewind", is_flag=True,
              help="Waive the consumer-offset checks (never the one-reader checks).")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def force_mode(connect: str, group: str, digest: str | None, pid_dir: Path | None,
               mode_name: str, acting: str | None, reason: str, accept_rewind: bool,
               yes: bool) -> None:
    """Write a group mode by hand, with a new epoch. Refuses anything that could give two
    brokers READ (force FENCING first), a SLAVE_CONSUME naming a broker that is not a live
    eligible slave, and NORMAL before the master persisted back-sync for this epoch."""
    _check_group(group)
    mode = Mode[mode_name.upper()]
    with _zk(connect, digest) as client:
        config, state, version, obs = _read(client, group, pid_dir)
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
        try:
            client.set(state_path(group), encode_state(new), version=version)
        except BadVersionError:
            raise click.ClickException(
                "the state changed while you were deciding (the controller moved); nothing "
                "written: look at 'understudy group status' and run again") from None
    click.echo(f"wrote {summary}", file=sys.stdout)
