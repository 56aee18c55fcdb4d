"""The failover controller: a pure state machine (:mod:`.machine`) fed with plain
observations (:mod:`.observe`) by a thin asyncio/ZooKeeper driver (:mod:`.driver`), with
pluggable liveness sources (:mod:`.liveness`). The same code runs in local mode and under
the Kubernetes operator; only the liveness source differs."""
