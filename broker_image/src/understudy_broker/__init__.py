"""Understudy broker: the data plane (commit log, wire protocol, replication) and its client."""
