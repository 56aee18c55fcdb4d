"""The topics a broker holds and how many queues each has: ``<data>/topics.json``.

Why this module exists: a topic's queue count decides which queue ids a produce or pull
may name, and it must survive a restart. The master owns the registry; slaves adopt it
from the replication metadata. Queue counts never shrink (a message already stored in
queue 7 stays addressable).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from understudy_broker.storage.durability import durable_replace
from understudy_broker.storage.records import CommitLogError


class TopicRegistry:
    """Topic -> queue count, persisted atomically (:func:`.durability.durable_replace`)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._topics: dict[str, int] = {}
        if path.exists():
            try:
                data = json.loads(path.read_text())
                raw = data["topics"]
                if not isinstance(raw, dict):
                    raise TypeError("topics is not an object")
                self._topics = {str(k): int(v) for k, v in raw.items()}
            except (ValueError, KeyError, TypeError) as exc:
                raise CommitLogError(f"{path} is unreadable: {exc}") from exc

    def get(self, topic: str) -> int | None:
        return self._topics.get(topic)

    def snapshot(self) -> dict[str, int]:
        return dict(self._topics)

    def create(self, topic: str, queues: int) -> bool:
        """True if created or grown; an existing topic with as many queues is left alone."""
        current = self._topics.get(topic, 0)
        if current >= queues:
            return False
        self._topics[topic] = queues
        self._save()
        return True

    def merge(self, topics: Mapping[str, int]) -> bool:
        """Adopt the master's topics (growing only). True when something changed."""
        changed = False
        for topic, queues in topics.items():
            if queues > self._topics.get(topic, 0):
                self._topics[topic] = queues
                changed = True
        if changed:
            self._save()
        return changed

    def _save(self) -> None:
        durable_replace(self._path, json.dumps({"topics": self._topics}, sort_keys=True).encode())
