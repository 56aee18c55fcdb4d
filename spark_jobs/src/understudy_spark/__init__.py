"""Understudy SLA jobs: PySpark over Prometheus exports, producing failover SLA reports."""
