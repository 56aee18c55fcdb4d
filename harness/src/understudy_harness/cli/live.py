"""A status line kept fresh while a command blocks in ``asyncio.run``."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from rich.console import Console


@contextlib.contextmanager
def live_status(console: Console, line: Callable[[], str], *,
                every_s: float = 0.2) -> Iterator[None]:
    """Show ``line()`` on ``console`` as a spinner, redrawn every ``every_s`` by a
    thread for as long as the body runs; the thread is stopped and joined on exit."""
    done = threading.Event()
    with console.status(line()) as live:

        def refresh() -> None:
            while not done.wait(every_s):
                live.update(line())

        ticker = threading.Thread(target=refresh, daemon=True)
        ticker.start()
        try:
            yield
        finally:
            done.set()
            ticker.join()
