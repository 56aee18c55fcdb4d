"""A broker dying under a client leaves no "Future exception was never retrieved" noise:
requests nobody awaits any more (a ``send()`` whose caller moved on, a ``request()``
whose write failed) are failed *and* marked retrieved; an awaiting caller still gets the
ConnectionError."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from understudy_broker import protocol as p
from understudy_broker.client import Connection


async def test_requests_pending_when_the_broker_dies_leave_no_unretrieved_futures(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="asyncio")
    accepted: asyncio.Queue[asyncio.StreamWriter] = asyncio.Queue()

    async def silent_broker(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await accepted.put(w)  # reads nothing, answers nothing

    server = await asyncio.start_server(silent_broker, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        conn = await Connection.open(f"127.0.0.1:{port}")
        forgotten = conn.send(p.Op.HEARTBEAT, b"{}")  # the caller never awaits it
        awaited = asyncio.ensure_future(conn.request(p.Op.HEARTBEAT, b"{}", timeout_s=30))
        async with asyncio.timeout(10):
            peer = await accepted.get()
        await asyncio.sleep(0)  # let the request be written
        peer.transport.abort()  # the broker dies: RST, no answer
        with pytest.raises(ConnectionError):
            async with asyncio.timeout(10):
                await awaited
        assert forgotten.done()  # failed; not inspected here, which would retrieve it
        assert conn.closed
        await conn.close()
        del forgotten, awaited
        gc.collect()
        await asyncio.sleep(0)
    finally:
        server.close()
        await server.wait_closed()
    assert "never retrieved" not in caplog.text, caplog.text


def test_a_write_on_a_transport_closed_under_the_connection_is_a_connection_error() -> None:
    """Under uvloop (what the CLI, the brokers and the benches run), writing to a transport
    already closed raises RuntimeError. A producer's batch task died of it once in ~60
    kill cycles of bench/cluster.py, and the sends of that batch never resolved; it must
    be the ConnectionError every caller retries, and leave no request pending."""
    uvloop = pytest.importorskip("uvloop")

    async def run() -> None:
        async def silent_broker(_r: asyncio.StreamReader, _w: asyncio.StreamWriter) -> None:
            await asyncio.sleep(30)

        server = await asyncio.start_server(silent_broker, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            conn = await Connection.open(f"127.0.0.1:{port}")
            conn._writer.transport.abort()  # closed under it; its reader has not run yet
            with pytest.raises(ConnectionError, match="is closed"):
                conn.send(p.Op.HEARTBEAT, b"{}")
            assert not conn._pending
            await conn.close()
        finally:
            server.close()

    uvloop.run(run())
