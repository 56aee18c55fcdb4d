"""The error a request is answered with (its status and message)."""

from __future__ import annotations

from understudy_broker import protocol as p


class RequestError(Exception):
    """A request that is answered with a non-OK status."""

    def __init__(self, status: p.Status, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
