"""The broker's HTTP side port: ``/metrics``, ``/healthz``, ``/readyz``, ``/permissions``.

Why this module exists: Prometheus scrapes and Kubernetes probes need plain HTTP, but
the broker needs no web framework for three GET endpoints. This is a deliberately tiny
HTTP/1.1 responder on asyncio streams: one request per connection, bounded header size,
anything else answered 404/405/400.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from understudy_broker.ha.permlog import CONTENT_TYPE, read_changes

MAX_REQUEST_HEAD = 8192


class HttpSidePort:
    """Serves the registry and two probes. ``ready()`` returns ``(ok, reason)``."""

    def __init__(
        self,
        *,
        registry: CollectorRegistry,
        ready: Callable[[], tuple[bool, str]],
        host: str,
        port: int,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self._tls = tls
        self._registry = registry
        self._ready = ready
        self._host = host
        self._port = port
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            return self._port
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self._host, self._port,
                                                  ssl=self._tls)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await self._server.wait_closed()

    def respond(self, method: str, path: str) -> tuple[int, str, bytes]:
        """Pure routing: status, content type, body."""
        path = path.split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            return 405, "text/plain", b"method not allowed\n"
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(self._registry)
        if path == "/healthz":
            return 200, "text/plain", b"ok\n"
        if path == "/readyz":
            ok, reason = self._ready()
            return (200 if ok else 503), "text/plain", (reason + "\n").encode()
        return 404, "text/plain", b"not found\n"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(5):
                head = await reader.readuntil(b"\r\n\r\n")
            parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
            if len(parts) != 3:
                status, ctype, body = 400, "text/plain", b"bad request\n"
                method = "GET"
            else:
                method = parts[0]
                status, ctype, body = self.respond(method, parts[1])
            reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
                      503: "Service Unavailable"}[status]
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + (b"" if method == "HEAD" else body)
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError,
                ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


class BrokerHttpPort(HttpSidePort):
    """The broker's side port: ``/metrics``, ``/healthz``, ``/readyz`` and ``/permissions``
    (the permission-change log as JSON lines, every incarnation of this broker)."""

    def __init__(
        self,
        *,
        registry: CollectorRegistry,
        ready: Callable[[], tuple[bool, str]],
        host: str,
        port: int,
        permissions: Path,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(registry=registry, ready=ready, host=host, port=port, tls=tls)
        self._permissions = permissions

    def respond(self, method: str, path: str) -> tuple[int, str, bytes]:
        if path.split("?", 1)[0] == "/permissions" and method in ("GET", "HEAD"):
            body = "".join(c.to_json() + "\n" for c in read_changes(self._permissions))
            return 200, CONTENT_TYPE, body.encode()
        return super().respond(method, path)
