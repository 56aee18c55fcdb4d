"""PartitionProxy (understudy_harness.testing): relays, black-holes, heals and stops."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from understudy_harness.testing import PartitionProxy


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    """A one-connection-at-a-time echo server on 127.0.0.1, stopped by the test."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(65536):
                    conn.sendall(data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield ("127.0.0.1", int(server.getsockname()[1]))
    finally:
        stop.set()
        server.shutdown(socket.SHUT_RDWR)
        server.close()
        thread.join(5)


def test_the_proxy_relays_goes_silent_when_cut_and_its_thread_ends_on_close(
        echo: tuple[str, int]) -> None:
    proxy = PartitionProxy(echo)
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as c:
            c.sendall(b"ping")
            assert c.recv(4) == b"ping"
        proxy.cut()
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as c:
            c.settimeout(0.5)
            c.sendall(b"lost")
            with pytest.raises(TimeoutError):
                c.recv(4)  # accepted, never answered: a silent partition
        proxy.heal()
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as c:
            c.sendall(b"back")
            assert c.recv(4) == b"back"
    finally:
        proxy.close()
    # Before, close() did not wake the thread blocked in accept(): it waited out its join
    # and the thread stayed for the rest of the test run.
    assert not proxy._thread.is_alive()
