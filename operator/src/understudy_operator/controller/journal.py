"""The controller's transition journal: one JSON line per transition it made.

Why this module exists: a ZooKeeper watch sees the *latest* state when it fires, so an
observer can miss a short-lived mode (RECOVERING often lasts tens of milliseconds). The
controller itself knows every transition it wrote, the moment its versioned write
succeeded. Written to a file, that is an audit trail for operators ("what did the
controller do, and why?") and the drill's exact source of mode changes.

Each line: ``{"t_ns", "group", "from", "mode", "epoch", "acting", "reason"}``; ``t_ns`` is
``time.time_ns()``, the clock the brokers' permission-change logs use on the same host.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from understudy_broker.model import GroupState, Mode
from understudy_operator.controller.driver import log_transition


@dataclass(frozen=True, slots=True)
class Transition:
    t_ns: int
    group: str
    previous: Mode
    mode: Mode
    epoch: int
    acting: str | None
    reason: str


class TransitionJournal:
    """Appends transitions to ``path`` (line-buffered) and logs them like the default."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fh: IO[str] | None = path.open("a", encoding="utf-8", buffering=1)

    def record(self, group: str, old: GroupState, new: GroupState) -> None:
        log_transition(group, old, new)
        if self._fh is None:
            return
        doc = {
            "t_ns": time.time_ns(),
            "group": group,
            "from": old.mode.name,
            "mode": new.mode.name,
            "epoch": new.epoch,
            "acting": new.acting,
            "reason": new.reason,
        }
        self._fh.write(json.dumps(doc, separators=(",", ":")) + "\n")

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def read_transitions(path: Path) -> list[Transition]:
    """Every whole line of a journal; a torn last line (the controller was killed while
    writing) is skipped, any other malformed line is a ValueError naming file and line."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").split("\n")
    out: list[Transition] = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
            out.append(
                Transition(
                    t_ns=int(doc["t_ns"]),
                    group=str(doc["group"]),
                    previous=Mode[str(doc["from"])],
                    mode=Mode[str(doc["mode"])],
                    epoch=int(doc["epoch"]),
                    acting=None if doc.get("acting") is None else str(doc["acting"]),
                    reason=str(doc.get("reason", "")),
                )
            )
        except (ValueError, KeyError, TypeError) as exc:
            if n == len(lines):  # the last line has no newline: torn by a kill mid-write
                break
            raise ValueError(f"{path}:{n}: malformed transition line: {exc!r}") from None
    return out
