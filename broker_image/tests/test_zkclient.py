"""The ZooKeeper client factory: kazoo's ``select`` replaced by one ``poll(2)``
(``zkclient.poll_select``), checked against ``select.select``'s contract on real sockets,
and a client built by ``make_client`` doing real work on it against a real ZooKeeper."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from understudy_broker.model import parse_address
from understudy_broker.zkclient import PollHandler, close_client, make_client, poll_select
from understudy_harness.testing import PartitionProxy


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def test_nothing_ready_waits_out_the_timeout_and_answers_empty(
        pair: tuple[socket.socket, socket.socket]) -> None:
    a, _b = pair
    assert poll_select([a], [], [], 0.05) == ([], [], [])


def test_readable_and_writable_are_the_objects_given(
        pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    b.send(b"x")
    assert poll_select([a], [], [], 0) == ([a], [], [])
    assert poll_select([], [b], [], 0) == ([], [b], [])
    # One socket asked for both: ready to read is what the caller acts on first, as
    # kazoo's own select answers.
    assert poll_select([a], [a], [], 0) == ([a], [], [])
    assert poll_select([a.fileno()], [], [], 0) == ([a.fileno()], [], [])


def test_a_peer_that_hung_up_is_ready_to_read(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    b.close()
    assert poll_select([a], [], [], 1.0) == ([a], [], [])
    assert a.recv(1) == b""


def test_descriptors_above_select_limit_are_fine(
        pair: tuple[socket.socket, socket.socket]) -> None:
    """select(2) refuses descriptors from 1024 up; a broker with many clients has them."""
    a, b = pair
    high = os.dup2(a.fileno(), 1500)
    try:
        b.send(b"x")
        assert poll_select([high], [], [], 0) == ([high], [], [])
    finally:
        os.close(high)


def test_bad_arguments_are_value_errors(pair: tuple[socket.socket, socket.socket]) -> None:
    a, _b = pair
    with pytest.raises(ValueError, match="non-negative"):
        poll_select([a], [], [], -1)
    with pytest.raises(ValueError, match="invalid file descriptor"):
        poll_select([-1], [], [], 0)


def test_a_client_from_make_client_uses_it_against_zookeeper(zk_server: Any) -> None:
    client = make_client(zk_server.connect, timeout_s=5.0)
    assert isinstance(client.handler, PollHandler)
    root = f"/zkclient-{uuid.uuid4().hex[:10]}"
    client.start(timeout=15)
    try:
        client.create(f"{root}/a", b"hello", makepath=True)
        assert client.get(f"{root}/a")[0] == b"hello"
        assert client.get_children(root) == ["a"]
        client.delete(root, recursive=True)
    finally:
        client.stop()
        client.close()


def test_two_closes_at_once_both_end_and_the_client_is_stopped(zk_server: Any) -> None:
    """A component's stop can meet the clean-up of its own start cut short: two threads
    closing one client. kazoo's stop() returns at once while the other thread's stop is
    still waiting for the connection to end, and its close() then raised "Cannot close
    connection until it is stopped" (a kopf test's teardown failed so). With the link cut,
    a stop waits for the server's answer to its close, which never comes."""
    proxy = PartitionProxy(parse_address(zk_server.connect.split("/")[0]))
    client = make_client(f"127.0.0.1:{proxy.port}", timeout_s=2.0)
    try:
        client.start(timeout=15)
        proxy.cut()
        errors: list[BaseException] = []

        def close() -> None:
            try:
                close_client(client)
            except BaseException as exc:  # collected for the assertion below
                errors.append(exc)

        first, second = threading.Thread(target=close), threading.Thread(target=close)
        first.start()
        threading.Event().wait(0.1)  # the first stop is waiting for the connection to end
        second.start()
        first.join(30)
        second.join(30)
        assert errors == []
        assert not first.is_alive()
        assert not second.is_alive()
        assert client._connection.connection_stopped.is_set()  # no connection thread left
    finally:
        proxy.close()
