"""Thin kopf handlers for ``BrokerGroup``: parse → plan → apply → patch status, one module per
verb (see :mod:`.app` for the wiring and :func:`.app.run` to start the operator)."""
