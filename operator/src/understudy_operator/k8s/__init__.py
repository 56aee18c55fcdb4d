"""Kubernetes-facing pure code for the Understudy operator.

Why this package exists: the kopf handlers must stay a few lines (parse, plan, apply, patch
status). Everything they compute lives here as pure functions over plain data, so it can be
tested without a cluster: :mod:`.spec` parses and validates a BrokerGroup spec, :mod:`.builders`
turns it into Kubernetes objects, :mod:`.zkconfig` into the ZooKeeper ``config`` document,
:mod:`.status` computes the ``status`` subresource, and :mod:`.metric_names` pins the metric names
that alerts and dashboards may use. Nothing in this package imports kopf, kubernetes or kazoo.
"""
