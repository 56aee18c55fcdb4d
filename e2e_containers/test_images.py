"""The built images, proven on a container runtime (podman with runc, as root).

- the broker runs as uid 10001 with a read-only root filesystem, and nothing but /data and
  /tmp is writable for it (every directory is asked, not a chosen few);
- its HEALTHCHECK passes once it serves and fails while the broker process is frozen
  (SIGSTOP of PID 1 from the host: a paused container cannot run its healthcheck at all,
  and PID 1 ignores a SIGSTOP sent from inside its own PID namespace), and passes again
  when it is continued;
- SIGTERM (``podman stop``) ends it within the grace period with exit status 0, and a new
  container on the same volume serves every acknowledged message and the committed offsets;
- the operator image starts read-only as uid 10001 and serves kopf's liveness probe (and
  its HEALTHCHECK passes); ``understudy --help`` works in both images.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from understudy_harness.containers import (
    BROKER_IMAGE,
    IMAGE_UID,
    OPERATOR_IMAGE,
    Attach,
    ContainerSpec,
    Mount,
    Podman,
    free_subnets,
    gateway,
    host_address,
)
from understudy_harness.containers_group import healthy
from understudy_operator.local.cluster import http_get

UNDERSTUDY = [sys.executable, "-c", "from understudy_broker.cli import main; main()"]
#: A broker on its own, listening on its container's address: without ZooKeeper it
#: advertises ``--host`` to clients as its route, and ``0.0.0.0`` (the image's CMD) routes a
#: client nowhere (docs/containers.md).
BROKER_ARGS = ("broker", "--data-dir", "/data", "--host", "{ip}", "--port", "9876",
               "--http-port", "9100", "--replication-port", "10912")
#: Lists every directory the container's user may write to (access(2) answers EROFS on a
#: read-only filesystem), kernel filesystems aside.
WRITABLE = """
import os
out = []
for top in sorted(os.listdir('/')):
    if top in ('proc', 'sys', 'dev'):
        continue
    for root, dirs, _ in os.walk('/' + top):
        if os.access(root, os.W_OK):
            out.append(root)
print('\\n'.join(out))
"""


def wait(what: str, cond: object, timeout: float = 60.0) -> float:
    """Poll ``cond`` until true; the seconds it took."""
    began = time.monotonic()
    while not cond():  # type: ignore[operator]
        assert time.monotonic() - began < timeout, f"{what}: not within {timeout:g}s"
        time.sleep(0.2)
    return time.monotonic() - began


def network(podman: Podman) -> tuple[str, str, str]:
    """A fresh network: (name, a container address on it, the host's address on it)."""
    (subnet,) = free_subnets(podman.used_subnets(), 1, start=os.getpid() % 200)
    name = podman.network_create("net", subnet)
    return name, host_address(subnet, 0), gateway(subnet)


def broker(podman: Podman, data: Path, *, command: tuple[str, ...] = (),
           stop_timeout: int = 10) -> tuple[str, str]:
    """A broker container (the image's CMD unless ``command``; ``{ip}`` in it is the
    container's address) on a fresh network with ``data`` as /data; (container ID, its
    address)."""
    data.mkdir(parents=True, exist_ok=True)
    os.chown(data, IMAGE_UID, IMAGE_UID)
    net, ip, _ = network(podman)
    cid = podman.start_container(ContainerSpec(
        name="broker", image=BROKER_IMAGE, attach=(Attach(net, ip),),
        command=tuple(arg.replace("{ip}", ip) for arg in command),
        mounts=(Mount(data, "/data"),), tmpfs=("/tmp",), stop_timeout=stop_timeout))
    wait("the broker answers /healthz", lambda: healthy(ip))
    return cid, ip


def uids(pid: int) -> list[int]:
    """Real, effective, saved and filesystem uid of a host process."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return [int(x) for x in line.split()[1:]]
    raise AssertionError(f"no Uid line for pid {pid}")


def test_broker_runs_as_10001_and_only_data_and_tmp_are_writable(
        podman: Podman, workdir: Path) -> None:
    cid, _ip = broker(podman, workdir / "data")
    state = podman.inspect(cid)
    assert state.read_only is True
    assert state.user == f"{IMAGE_UID}:{IMAGE_UID}"
    assert uids(state.pid) == [IMAGE_UID] * 4  # PID 1 of the container, seen from the host
    found = podman.exec(cid, "python3", "-c", WRITABLE, check=True).stdout.split()
    assert found, "the broker's user can write nowhere"
    assert all(p == "/data" or p.startswith(("/data/", "/tmp")) for p in found), found
    assert "/data" in found
    assert "/tmp" in found
    for path in ("/", "/opt/venv", "/etc", "/usr/local", "/var/tmp", "/run"):
        proc = podman.exec(cid, "sh", "-c", f"touch {path}/probe")
        assert proc.returncode != 0, path
        assert "Read-only file system" in proc.stderr or "Permission denied" in proc.stderr
    assert "Read-only file system" in podman.exec(cid, "touch", "/opt/venv/probe").stderr
    print(f"\nbroker: uid {uids(state.pid)}, read-only root, writable: /data, /tmp "
          f"({len(found)} directories under them)")


def test_broker_healthcheck_passes_when_ready_and_fails_while_frozen(
        podman: Podman, workdir: Path) -> None:
    cid, ip = broker(podman, workdir / "data")  # the image's own CMD
    took = wait("HEALTHCHECK passes", lambda: podman.healthcheck(cid)[0])
    pid = podman.inspect(cid).pid
    os.kill(pid, signal.SIGSTOP)  # the broker (PID 1) frozen, from the host
    try:
        time.sleep(0.5)
        assert http_get(9100, "/healthz", host=ip, timeout=1.0) is None
        began = time.monotonic()
        ok, out = podman.healthcheck(cid)
        failed_in = time.monotonic() - began
        assert not ok, f"HEALTHCHECK passed with the broker frozen: {out}"
        assert "unhealthy" in out, out
    finally:
        os.kill(pid, signal.SIGCONT)
    wait("HEALTHCHECK passes again", lambda: podman.healthcheck(cid)[0], timeout=30)
    print(f"\nHEALTHCHECK: passed {took:.1f} s after /healthz answered; frozen: failed "
          f"({out!r}) after {failed_in:.1f} s; continued: passes")


def understudy(*args: str, timeout: float = 120) -> dict[str, object]:
    """Run a client command of the host's CLI with ``--json``; its summary (``consume``
    exits 1 when it got fewer than ``-n``: the summary says how many)."""
    proc = subprocess.run([*UNDERSTUDY, *args, "--json"], capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert proc.stdout.strip(), proc.stderr[-2000:]
    doc: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return doc


def test_sigterm_flushes_and_exits_within_the_grace_period_with_nothing_lost(
        podman: Podman, workdir: Path) -> None:
    grace = 10
    # A master on its own (no slave to acknowledge with: --async), its log flushed on an
    # interval longer than the test: what SIGTERM finds unflushed it must flush.
    command = (*BROKER_ARGS, "--async", "--flush", "interval", "--flush-interval-ms", "600000")
    data = workdir / "data"
    cid, ip = broker(podman, data, command=command, stop_timeout=grace)
    boot = f"{ip}:9876"
    made = subprocess.run([*UNDERSTUDY, "topic", "create", "-b", boot, "-t", "t", "-q", "4"],
                          check=False, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    produced = understudy("produce", "-b", boot, "-t", "t", "-n", "3000", "-s", "200")
    assert produced["acked"] == 3000, produced
    assert produced["failed"] == 0, produced
    half = understudy("consume", "-b", boot, "-t", "t", "-g", "half", "-n", "1500",
                      "--idle-timeout", "10")
    assert half["consumed"] == 1500, half
    took = podman.stop(cid, grace)
    state = podman.inspect(cid)
    log = podman.logs(cid, tail=20)
    assert state.exit_code == 0, f"exit {state.exit_code} (137: killed after the grace)\n{log}"
    assert took < grace, f"podman stop took {took:.1f} s, the grace is {grace} s"
    podman.remove(cid)

    cid2, ip2 = broker(podman, data, command=command, stop_timeout=grace)
    boot = f"{ip2}:9876"
    everything = workdir / "all.jsonl"
    fresh = understudy("consume", "-b", boot, "-t", "t", "-g", "fresh", "-n", "3000",
                       "--idle-timeout", "10", "--record", str(everything))
    rest = understudy("consume", "-b", boot, "-t", "t", "-g", "half", "-n", "3000",
                      "--idle-timeout", "5")
    positions = {(d["queue"], d["offset"]) for d in map(json.loads, everything.read_text().splitlines())
                 if d.get("kind") == "deliver"}
    assert fresh["consumed"] == 3000, fresh
    assert len(positions) == 3000, fresh
    assert rest["consumed"] == 1500, rest  # resumed from its committed offsets
    podman.stop(cid2, grace)
    print(f"\nSIGTERM: exit 0 in {took:.2f} s (grace {grace} s); after a restart on the same "
          f"volume: 3000/3000 acknowledged messages, the committed group resumed with "
          f"{rest['consumed']} left")


def test_operator_image_serves_its_liveness_probe(podman: Podman) -> None:
    net, ip, host = network(podman)
    # No API server here: kopf retries its requests (to the host's side of the network,
    # where nothing listens) while its liveness endpoint serves.
    cid = podman.start_container(ContainerSpec(
        name="operator", image=OPERATOR_IMAGE, attach=(Attach(net, ip),), tmpfs=("/tmp",),
        command=("operator", "-n", "default", "--no-scanning", "--server",
                 f"http://{host}:9", "--metrics-port", "8080", "--health-port", "8081")))
    took = wait("the operator's /healthz answers",
                lambda: http_get(8081, "/healthz", host=ip, timeout=1.0) is not None)
    state = podman.inspect(cid)
    assert state.read_only is True
    assert uids(state.pid) == [IMAGE_UID] * 4
    assert wait("its HEALTHCHECK passes", lambda: podman.healthcheck(cid)[0], timeout=30) < 30
    assert http_get(8080, "/metrics", host=ip) is not None
    stopped = podman.stop(cid, 10)
    print(f"\noperator: /healthz in {took:.1f} s, uid {IMAGE_UID}, read-only; "
          f"SIGTERM: exit {podman.inspect(cid).exit_code} in {stopped:.1f} s")


@pytest.mark.parametrize("image", [BROKER_IMAGE, OPERATOR_IMAGE])
def test_understudy_help_works_in_the_image(podman: Podman, image: str) -> None:
    cid = podman.start_container(ContainerSpec(name="help", image=image, command=("--help",),
                                               tmpfs=("/tmp",)))
    wait("understudy --help exits", lambda: not podman.inspect(cid).running, timeout=60)
    assert podman.inspect(cid).exit_code == 0
    out = podman.logs(cid, tail=200)
    assert "Usage: understudy" in out, out
    for command in ("broker", "controller", "operator", "produce", "consume"):
        assert command in out, command
