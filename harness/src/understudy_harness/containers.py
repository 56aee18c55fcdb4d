"""Containers for the image tests and the container suite: podman, driven from the host.

Why this module exists: the broker and operator images must be proven on a real container
runtime (non-root, read-only root filesystem, health-checked, stopped by SIGTERM), and a
broker group must be hurt the way containers are hurt — ``podman kill`` of PID 1, ``podman
pause`` (a cgroup freeze), ``podman network disconnect`` (a real partition). There is no
Docker engine on these machines, but Debian's podman with runc runs containers as root
(docs/containers.md). The decisions are pure functions over plain data — a container's
``podman run`` argv (:func:`run_argv`), the state read from ``podman inspect``
(:func:`parse_inspect`), which subnets are free (:func:`free_subnets`), why podman cannot
run here (:func:`skip_reason`) — and :class:`Podman` is the thin I/O around them. It
remembers every container and network it created and removes them by ID on
:meth:`Podman.close`, whatever happened before.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

#: The project's podman settings (runc, ulimits, no systemd): scripts/containers.conf.
REPO_ROOT: Final = Path(__file__).resolve().parents[3]
CONTAINERS_CONF: Final = REPO_ROOT / "scripts" / "containers.conf"
#: The images ``make images`` builds (scripts/images.sh), and the suite's ZooKeeper.
BROKER_IMAGE: Final = "localhost/understudy/broker:dev"
OPERATOR_IMAGE: Final = "localhost/understudy/operator:dev"
ZOOKEEPER_IMAGE: Final = "localhost/understudy-zookeeper:bookworm"
#: The uid the images run as.
IMAGE_UID: Final = 10001
#: Where the suite's networks are carved from: /24s of 10.213.0.0/16 (``free_subnets``).
SUBNET_POOL: Final = ipaddress.IPv4Network("10.213.0.0/16")


class ContainerError(RuntimeError):
    """A podman command failed; the message holds the command and its output."""


# ------------------------------------------------------------------------ pure parts


@dataclass(frozen=True, slots=True)
class Attach:
    """A container's place on a network: the network's name, its fixed address and a MAC
    address derived from it (:func:`mac_for`)."""

    network: str
    ip: str

    @property
    def mac(self) -> str:
        return mac_for(self.ip)


def mac_for(ip: str) -> str:
    """A locally administered MAC address made of ``ip`` (``02:42`` and its four bytes, as
    Docker does). A container started again, or connected again, on its address keeps its
    MAC, so the peers' and the host's neighbour caches stay right; with a new random MAC
    they send to the old one until their entries go stale (about 30-60 s). Pure."""
    return "02:42:" + ":".join(f"{int(octet):02x}" for octet in ip.split("."))


@dataclass(frozen=True, slots=True)
class Mount:
    """A host directory bind-mounted into the container."""

    source: Path
    target: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """What one ``podman run -d`` starts. ``read_only``: the root filesystem is read-only
    and only ``tmpfs`` paths and ``mounts`` can be written (podman's own extra tmpfs
    mounts are turned off: ``--read-only-tmpfs=false``). ``entrypoint``: replace the
    image's (``None`` keeps it); ``command``: the arguments after it (``()`` keeps the
    image's CMD). ``stop_timeout``: seconds ``podman stop`` waits after SIGTERM before
    SIGKILL. The image's HEALTHCHECK is kept but never run by a timer (no systemd here):
    :meth:`Podman.healthcheck` runs it."""

    name: str
    image: str
    attach: tuple[Attach, ...] = ()
    command: tuple[str, ...] = ()
    entrypoint: str | None = None
    mounts: tuple[Mount, ...] = ()
    tmpfs: tuple[str, ...] = ()
    read_only: bool = True
    user: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    stop_timeout: int = 10
    labels: Mapping[str, str] = field(default_factory=dict)


def run_argv(spec: ContainerSpec) -> list[str]:
    """The ``podman run -d`` arguments (after ``podman``) that start ``spec``. Pure."""
    argv = ["run", "-d", "--name", spec.name, "--stop-timeout", str(spec.stop_timeout),
            "--health-interval", "disable"]
    if spec.read_only:
        argv += ["--read-only", "--read-only-tmpfs=false"]
    for a in spec.attach:  # podman 4.3 takes --ip for one network only; this for several
        argv += ["--network", f"{a.network}:ip={a.ip},mac={a.mac}"]
    if not spec.attach:
        argv += ["--network", "none"]
    for m in spec.mounts:
        argv += ["-v", f"{m.source}:{m.target}:{'ro' if m.read_only else 'rw'}"]
    for path in spec.tmpfs:
        argv += ["--tmpfs", f"{path}:rw,nosuid,nodev,mode=1777"]
    if spec.user is not None:
        argv += ["--user", spec.user]
    for k, v in sorted(spec.env.items()):
        argv += ["--env", f"{k}={v}"]
    for k, v in sorted(spec.labels.items()):
        argv += ["--label", f"{k}={v}"]
    if spec.entrypoint is not None:
        argv += ["--entrypoint", spec.entrypoint]
    argv.append(spec.image)
    argv += list(spec.command)
    return argv


@dataclass(frozen=True, slots=True)
class ContainerState:
    """What ``podman inspect`` says of a container."""

    id: str
    name: str
    status: str  # running, paused, exited, created, ...
    pid: int  # PID 1's PID on the host (0 when not running)
    exit_code: int
    #: Network name -> the container's address on it.
    addresses: Mapping[str, str]
    user: str
    read_only: bool
    health: str | None  # healthy, unhealthy, starting; None without a healthcheck
    started_at: str = ""
    finished_at: str = ""

    @property
    def running(self) -> bool:
        return self.status == "running"


def parse_inspect(doc: Mapping[str, Any]) -> ContainerState:
    """One object of ``podman inspect --type container`` as a :class:`ContainerState`. Pure."""
    state = doc.get("State") or {}
    nets = ((doc.get("NetworkSettings") or {}).get("Networks")) or {}
    health = state.get("Health") or state.get("Healthcheck") or {}
    return ContainerState(
        id=str(doc["Id"]),
        name=str(doc.get("Name", "")).lstrip("/"),
        status=str(state.get("Status", "")),
        pid=int(state.get("Pid") or 0),
        exit_code=int(state.get("ExitCode") or 0),
        addresses={str(n): str(v.get("IPAddress", "")) for n, v in nets.items()},
        user=str((doc.get("Config") or {}).get("User", "")),
        read_only=bool((doc.get("HostConfig") or {}).get("ReadonlyRootfs", False)),
        health=(str(health["Status"]) if health.get("Status") else None),
        started_at=str(state.get("StartedAt", "")),
        finished_at=str(state.get("FinishedAt", "")),
    )


def free_subnets(used: Iterable[str], count: int, *, pool: ipaddress.IPv4Network = SUBNET_POOL,
                 start: int = 0) -> list[ipaddress.IPv4Network]:
    """``count`` /24 subnets of ``pool`` that overlap none of ``used`` (CIDR strings: the
    subnets of the existing networks and the host's routes), from the ``start``-th /24 on
    (wrapping). Pure; :class:`ContainerError` when the pool has too few."""
    taken = [ipaddress.ip_network(u, strict=False) for u in used]
    candidates = list(pool.subnets(new_prefix=24))
    out: list[ipaddress.IPv4Network] = []
    for i in range(len(candidates)):
        net = candidates[(start + i) % len(candidates)]
        if not any(net.overlaps(t) for t in taken if t.version == 4):
            out.append(net)
            if len(out) == count:
                return out
    raise ContainerError(f"no {count} free /24 subnets left in {pool}")


def host_address(subnet: ipaddress.IPv4Network, index: int) -> str:
    """The ``index``-th container address of ``subnet`` (.10, .11, ...; .1 is the host's
    side of the bridge). Pure."""
    return str(subnet.network_address + 10 + index)


def gateway(subnet: ipaddress.IPv4Network) -> str:
    """The host's address on a network of ``subnet`` (its bridge). Pure."""
    return str(subnet.network_address + 1)


def skip_reason(*, which: Mapping[str, str | None], probe: tuple[int, str] | None,
                images: Mapping[str, bool] | None = None) -> str | None:
    """Why the container suite cannot run here, or ``None``. ``which``: tool -> path (or
    None: missing); ``probe``: the exit status and output of a throw-away ``podman run``
    (None: not tried); ``images``: image -> present. Pure."""
    for tool in ("podman", "runc"):
        if which.get(tool) is None:
            return (f"{tool} is not installed: run 'make images' (it installs podman, runc "
                    "and debootstrap on Debian)")
    if probe is not None and probe[0] != 0:
        lines = [ln for ln in probe[1].strip().splitlines() if ln.strip()]
        return f"podman cannot run a container here: {lines[-1] if lines else 'no output'}"
    missing = [name for name, present in (images or {}).items() if not present]
    if missing:
        return f"image(s) not built: {', '.join(missing)} (run 'make images')"
    return None


# -------------------------------------------------------------------------- the I/O


def podman_env() -> dict[str, str]:
    """The environment podman runs with: this project's containers.conf, unless the caller
    set ``CONTAINERS_CONF`` already."""
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", str(CONTAINERS_CONF))
    return env


class Podman:
    """podman on this machine, as root. Everything it creates is remembered by ID and
    removed by :meth:`close` (containers first, then networks). ``prefix`` starts every
    name, so a run's objects are easy to tell apart in ``podman ps``."""

    def __init__(self, prefix: str, *, binary: str = "podman") -> None:
        self.prefix = prefix
        self.binary = binary
        self.env = podman_env()
        self.containers: list[str] = []
        self.networks: list[str] = []

    # ---- plumbing

    def run(self, *args: str, check: bool = True, timeout: float = 120,
            input_text: str | None = None) -> subprocess.CompletedProcess[str]:
        """``podman ARGS``; a non-zero exit raises :class:`ContainerError` (``check``)."""
        try:
            proc = subprocess.run([self.binary, *args], capture_output=True, text=True,
                                  timeout=timeout, env=self.env, check=False,
                                  input=input_text)
        except subprocess.TimeoutExpired as exc:
            raise ContainerError(f"podman {' '.join(args)} timed out after {timeout:g}s") from exc
        if check and proc.returncode != 0:
            raise ContainerError(f"podman {' '.join(args)} exited {proc.returncode}: "
                                 f"{proc.stderr.strip() or proc.stdout.strip()}")
        return proc

    # ---- networks

    def used_subnets(self) -> list[str]:
        """Subnets of every podman network and every route of the host (IPv4 CIDRs)."""
        out: list[str] = []
        names = self.run("network", "ls", "--format", "{{.Name}}").stdout.split()
        if names:
            for net in json.loads(self.run("network", "inspect", *names).stdout):
                for sub in net.get("subnets") or []:
                    out.append(str(sub.get("subnet", "")))
                for plugin in net.get("plugins") or []:  # CNI: ipam ranges
                    for rng in ((plugin.get("ipam") or {}).get("ranges") or []):
                        out += [str(r.get("subnet", "")) for r in rng]
        if shutil.which("ip"):
            routes = subprocess.run(["ip", "-4", "route", "show"], capture_output=True,
                                    text=True, check=False).stdout
            out += [line.split()[0] for line in routes.splitlines()
                    if line and line.split()[0][0].isdigit()]
        return [s for s in out if "/" in s]

    def network_create(self, name: str, subnet: ipaddress.IPv4Network) -> str:
        full = f"{self.prefix}-{name}"
        if full in self.networks:  # a second one of that name in this run
            full = f"{full}{len(self.networks)}"
        # isolate: no forwarding between this and other podman networks through the host
        # (else a container cut from one network still reaches it through another's
        # gateway, and a partition is none).
        self.run("network", "create", "--subnet", str(subnet), "--gateway", gateway(subnet),
                 "--opt", "isolate=true", full)
        self.networks.append(full)  # podman 4.3 (CNI) names, not IDs, identify a network
        return full

    def disconnect(self, network: str, container: str) -> None:
        self.run("network", "disconnect", network, container)

    def connect(self, network: str, container: str, ip: str) -> None:
        self.run("network", "connect", "--ip", ip, "--mac-address", mac_for(ip), network,
                 container)

    # ---- containers

    def start_container(self, spec: ContainerSpec) -> str:
        """``podman run -d`` ``spec`` (its name prefixed); returns the container ID."""
        named = ContainerSpec(**{**_fields(spec), "name": f"{self.prefix}-{spec.name}"})
        cid = self.run(*run_argv(named)).stdout.strip()
        self.containers.append(cid)
        return cid

    def inspect(self, container: str) -> ContainerState:
        doc = json.loads(self.run("inspect", "--type", "container", container).stdout)
        return parse_inspect(doc[0])

    def kill(self, container: str, signal: str = "KILL") -> None:
        self.run("kill", "--signal", signal, container)

    def pause(self, container: str) -> None:
        self.run("pause", container)

    def unpause(self, container: str) -> None:
        self.run("unpause", container)

    def stop(self, container: str, timeout_s: int) -> float:
        """``podman stop -t timeout_s``; the seconds it took."""
        began = time.monotonic()
        self.run("stop", "-t", str(timeout_s), container, timeout=timeout_s + 60)
        return time.monotonic() - began

    def start(self, container: str) -> None:
        self.run("start", container)

    def remove(self, container: str) -> None:
        self.run("rm", "-f", "-t", "0", container, check=False)
        if container in self.containers:
            self.containers.remove(container)

    def exec(self, container: str, *argv: str, user: str | None = None,
             check: bool = False, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        args = ["exec", *(("--user", user) if user else ()), container, *argv]
        return self.run(*args, check=check, timeout=timeout)

    def healthcheck(self, container: str) -> tuple[bool, str]:
        """Run the image's HEALTHCHECK once (``podman healthcheck run``): (passed, output)."""
        proc = self.run("healthcheck", "run", container, check=False, timeout=60)
        return proc.returncode == 0, (proc.stdout + proc.stderr).strip()

    def logs(self, container: str, tail: int = 40) -> str:
        proc = self.run("logs", "--tail", str(tail), container, check=False)
        return (proc.stdout + proc.stderr).strip()

    def image_exists(self, image: str) -> bool:
        return self.run("image", "exists", image, check=False).returncode == 0

    def image_size(self, image: str) -> int:
        return int(self.run("image", "inspect", "-f", "{{.Size}}", image).stdout.strip())

    def close(self) -> list[str]:
        """Remove every container (by ID) and network this object created; returns what
        could not be removed (empty when everything went)."""
        left: list[str] = []
        for cid in reversed(self.containers):
            proc = self.run("rm", "-f", "-t", "0", cid, check=False, timeout=120)
            if proc.returncode != 0 and "no such container" not in proc.stderr.lower():
                left.append(f"container {cid}: {proc.stderr.strip()}")
        self.containers.clear()
        for net in reversed(self.networks):
            proc = self.run("network", "rm", "-f", net, check=False, timeout=120)
            if proc.returncode != 0 and "unable to find" not in proc.stderr.lower():
                left.append(f"network {net}: {proc.stderr.strip()}")
        self.networks.clear()
        return left


def _fields(spec: ContainerSpec) -> dict[str, Any]:
    return {name: getattr(spec, name) for name in ContainerSpec.__slots__}


def probe_podman(image: str, binary: str = "podman") -> tuple[int, str]:
    """Run ``true`` in ``image`` once (removed after): (exit status, output)."""
    try:
        proc = subprocess.run(
            [binary, "run", "--rm", "--network", "none", "--health-interval", "disable",
             "--entrypoint", "/bin/true", image],
            capture_output=True, text=True, timeout=120, env=podman_env(), check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 1, str(exc)
    return proc.returncode, proc.stdout + proc.stderr


def why_not_here(images: Sequence[str]) -> str | None:
    """Why the container suite cannot run on this machine (``None``: it can): not root,
    podman or runc missing, an image not built, or podman unable to run a container."""
    if os.geteuid() != 0:
        return "the container suite runs podman as root (networks, partitions); run it as root"
    which = {tool: shutil.which(tool) or (f"/usr/sbin/{tool}" if Path(f"/usr/sbin/{tool}").exists() else None)
             for tool in ("podman", "runc")}
    early = skip_reason(which=which, probe=None)
    if early is not None:
        return early
    pm = Podman("understudy-probe")
    present = {image: pm.image_exists(image) for image in images}
    early = skip_reason(which=which, probe=None, images=present)
    if early is not None:
        return early
    return skip_reason(which=which, probe=probe_podman(images[0]))
