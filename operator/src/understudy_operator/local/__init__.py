"""The local cluster: ZooKeeper, brokers and the failover controller as processes on this
machine (``understudy local ...``), used by people, the drill and the tests."""
