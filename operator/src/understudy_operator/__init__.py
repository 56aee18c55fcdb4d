"""Understudy operator: failover controller, local cluster, drill, and the kopf operator."""
