"""Master -> slave replication of the commit log (see :mod:`.wire` for the protocol).

:mod:`.isr` holds the in-sync rules as pure functions, :mod:`.master` the master's side
(:class:`~.master.ReplicationServer`), :mod:`.slave` the slave's
(:class:`~.slave.ReplicationClient`).
"""
