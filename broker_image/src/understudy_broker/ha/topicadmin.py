"""ADMIN_TOPIC on a broker: create, alter or delete ``/topics/<topic>`` with versioned writes.

Why this module exists: `understudy topic create|alter|delete` talk to any broker, never
to ZooKeeper. The broker applies the pure rules of :mod:`understudy_broker.topology` to
the document it reads and writes the result with the znode version it read, so two
admins racing cannot lose each other's change (the loser gets ``CONFLICT`` and re-reads).
"""

from __future__ import annotations

from collections.abc import Sequence

from kazoo.exceptions import BadVersionError, NoNodeError

from understudy_broker import protocol as p
from understudy_broker.ha.authority import Authority
from understudy_broker.topicnodes import TopicNodesExist, create_topic_nodes, delete_topic_nodes
from understudy_broker.topology import check_delete, plan_alter, plan_create
from understudy_broker.zkclient import kazoo_future
from understudy_broker.zklayout import LayoutError, TopicDoc, topic_path


class TopicConflict(Exception):
    """The topic exists (create) or changed since it was read (alter, delete)."""


class TopicAdmin:
    def __init__(self, authority: Authority) -> None:
        self._authority = authority

    async def apply(self, req: p.AdminTopicRequest, *, known_groups: Sequence[str]
                    ) -> TopicDoc | None:
        """The topic after the change (None after a delete). Raises ``TopicPlanError``
        (refused, nothing changed), :class:`TopicConflict` or ``LookupError`` (no topic)."""
        view = self._authority.cluster
        assert view is not None  # the handler checked
        client, loop = view.client, view.loop
        path = topic_path(req.topic)
        if req.action == "create":
            doc = plan_create(req.topic, req.groups, req.queues_per_group or 1,
                              known_groups=known_groups, ordered=req.ordered)
            try:
                await create_topic_nodes(client, doc, acl=view.acl, loop=loop)
            except TopicNodesExist as exc:
                raise TopicConflict(str(exc)) from None
            await view.wait_topic(req.topic, doc)
            return doc
        try:
            raw, stat = await kazoo_future(loop, client.get_async(path))
        except NoNodeError:
            raise LookupError(f"unknown topic {req.topic!r}") from None
        try:
            current = TopicDoc.from_json(raw)
        except LayoutError as exc:
            if req.action != "delete" or not req.force:
                raise TopicConflict(f"topic {req.topic!r} is unreadable ({exc}); "
                                    "only a forced delete may remove it") from None
            current = TopicDoc(req.topic, ())
        try:
            if req.action == "delete":
                check_delete(current, backlog=req.backlog, force=req.force)
                # An ordered topic's chains go with it, in the same transaction.
                if not await delete_topic_nodes(client, req.topic, loop=loop,
                                                version=stat.version):
                    raise NoNodeError
                await view.wait_topic(req.topic, None)
                return None
            doc = plan_alter(current, known_groups=known_groups, add_groups=req.add_groups,
                             remove_groups=req.remove_groups,
                             queues_per_group=req.queues_per_group, backlog=req.backlog,
                             force=req.force)
            await kazoo_future(loop, client.set_async(path, doc.to_json(), version=stat.version))
        except (BadVersionError, NoNodeError):
            raise TopicConflict(f"topic {req.topic!r} changed while being altered; retry") from None
        await view.wait_topic(req.topic, doc)
        return doc
