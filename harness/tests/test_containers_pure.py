"""The container suite's pure decisions (``understudy_harness.containers`` and
``containers_group``), in the default run: the suite itself needs podman and built images
(``make e2e-containers``), these do not."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from understudy_harness.containers import (
    Attach,
    ContainerError,
    ContainerSpec,
    Mount,
    free_subnets,
    host_address,
    mac_for,
    parse_inspect,
    run_argv,
    skip_reason,
)
from understudy_harness.containers_group import container_broker_args, plan_layout

TOOLS = {"podman": "/usr/bin/podman", "runc": "/usr/sbin/runc"}


def test_a_container_keeps_its_mac_on_its_address() -> None:
    assert mac_for("10.213.4.12") == "02:42:0a:d5:04:0c"
    assert Attach("data", "10.213.4.12").mac == mac_for("10.213.4.12")


def test_run_argv_is_read_only_with_only_the_named_writable_paths() -> None:
    spec = ContainerSpec(name="b", image="img", attach=(Attach("data", "10.0.0.10"), Attach("zk", "10.0.1.12")),
                         mounts=(Mount(Path("/h/d"), "/data"), Mount(Path("/h/c"), "/conf", read_only=True)),
                         tmpfs=("/tmp",), user="10001:10001", command=("broker", "--port", "1"))
    argv = run_argv(spec)
    assert argv[:3] == ["run", "-d", "--name"]
    assert "--read-only" in argv
    assert "--read-only-tmpfs=false" in argv
    assert argv.count("--network") == 2
    assert "data:ip=10.0.0.10,mac=02:42:0a:00:00:0a" in argv
    assert "/h/d:/data:rw" in argv
    assert "/h/c:/conf:ro" in argv
    assert argv[-4:] == ["img", "broker", "--port", "1"]  # the image, then its arguments
    assert "--network" in run_argv(ContainerSpec(name="n", image="img"))  # none: no network
    assert "none" in run_argv(ContainerSpec(name="n", image="img"))


def test_inspect_is_read_into_a_state() -> None:
    state = parse_inspect({
        "Id": "abc", "Name": "/us-1-g1-0",
        "State": {"Status": "running", "Pid": 4242, "ExitCode": 0, "Health": {"Status": "healthy"}},
        "NetworkSettings": {"Networks": {"data": {"IPAddress": "10.0.0.10"}}},
        "Config": {"User": "10001:10001"}, "HostConfig": {"ReadonlyRootfs": True}})
    assert (state.name, state.pid, state.health, state.read_only) == ("us-1-g1-0", 4242, "healthy", True)
    assert state.running
    assert state.addresses == {"data": "10.0.0.10"}
    assert parse_inspect({"Id": "x", "State": {"Status": "exited", "ExitCode": 137}}).health is None


def test_subnets_avoid_every_network_and_route_in_use() -> None:
    pool = ipaddress.IPv4Network("10.213.0.0/22")  # four /24s
    got = free_subnets(["10.213.0.0/24", "10.213.2.7/32"], 2, pool=pool)
    assert [str(n) for n in got] == ["10.213.1.0/24", "10.213.3.0/24"]
    with pytest.raises(ContainerError, match="no 3 free"):
        free_subnets(["10.213.0.0/23"], 3, pool=pool)
    assert host_address(got[0], 0) == "10.213.1.10"


def test_the_suite_says_why_it_cannot_run() -> None:
    assert "podman is not installed" in (skip_reason(which={"podman": None, "runc": "/r"}, probe=None) or "")
    assert "runc is not installed" in (skip_reason(which={**TOOLS, "runc": None}, probe=None) or "")
    refused = skip_reason(which=TOOLS, probe=(125, "Error: crun: setrlimit: not permitted\n\n"))
    assert refused == "podman cannot run a container here: Error: crun: setrlimit: not permitted"
    assert "image(s) not built: b" in (skip_reason(which=TOOLS, probe=(0, ""), images={"a": True, "b": False}) or "")
    assert skip_reason(which=TOOLS, probe=(0, ""), images={"a": True}) is None


def test_a_group_is_planned_like_local_up_with_container_paths(tmp_path: Path) -> None:
    data, zk = ipaddress.IPv4Network("10.213.8.0/24"), ipaddress.IPv4Network("10.213.9.0/24")
    layout = plan_layout(tmp_path, slaves=1, data_subnet=data, zk_subnet=zk)
    assert [b.name for b in layout.group.brokers] == ["g1-0", "g1-1"]
    assert layout.zk_ip == "10.213.9.10"
    master = layout.broker_args["g1-0"]
    assert master[master.index("--data-dir") + 1] == "/data"
    assert master[master.index("--host") + 1] == "0.0.0.0"
    assert "10.213.9.10" in " ".join(master)  # ZooKeeper on its own network
    assert container_broker_args(["broker", "--data-dir", "/h/x", "--host", "1.2.3.4"]) == (
        "broker", "--data-dir", "/data", "--host", "0.0.0.0")
