"""SIGUSR1 makes a running broker write every asyncio task and its await chain to its log,
and it keeps serving: what an operator needs from a broker that is alive but stuck."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import pytest

from understudy_broker.client import Consumer, Producer, create_topic

pytestmark = pytest.mark.integration


def dumped_log(master: Any) -> str:
    deadline = time.monotonic() + 10
    while "--- end of tasks" not in master.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    return str(master.log())


async def test_sigusr1_dumps_the_tasks_and_the_broker_keeps_serving(brokers: Any) -> None:
    master = brokers.master(extra=["--async"])
    await create_topic([master.address], topic="dump", queues=1)
    os.kill(master.pid, signal.SIGUSR1)
    log = await asyncio.to_thread(dumped_log, master)
    dump = log[log.index("--- ") : log.index("--- end of tasks")]
    assert " tasks (SIGUSR1)" in dump
    # Each task by name with its await chain, down to where it waits.
    chain = dump[dump.index("recovery-point:"):].split("\n")
    assert "storage/store.py" in chain[1]
    assert "run_recovery_points" in chain[1]
    assert "sleep" in "\n".join(chain[2:4])
    async with Producer([master.address]) as prod:
        assert (await (await prod.send("dump", b"after"))) == (0, 0)
    async with Consumer([master.address], group="g", topic="dump") as cons:
        assert [r.body for r in await cons.getmany(timeout_s=5)] == [b"after"]
