"""The verification harness: the failover drill, the invariant checker and its histories,
recorded workloads, a private Prometheus, and the pytest plugin every test suite shares.

Why this package exists: the product (broker, operator, SLA jobs) must be judged by code
it does not contain. The harness drives real processes and records what happened; the one
checker judges it. Product packages never import this one (an import-linter contract in
``make lint``); the harness imports the product freely.
"""
