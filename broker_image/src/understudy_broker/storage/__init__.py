"""Storage: the commit log, its per-queue indexes, consumer offsets, topics, durability.

Nothing here knows the wire protocol or asyncio servers: errors are ``OSError`` or
:class:`.records.CommitLogError` subclasses, and the server maps them to statuses.
:mod:`.records` is the record format and the one walker over stored bytes;
:mod:`.durability` the one atomic replace and the one group commit.
"""
