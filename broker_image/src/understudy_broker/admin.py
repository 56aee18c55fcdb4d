"""Admin calls over the wire: cluster topics and consumer groups, as the CLI shows them.

Why this module exists: ``understudy topic create|alter|delete|describe`` and
``understudy consumer-group describe`` need more than one request: a describe asks every
group of the topic for its queues' log ends and committed offsets (QUEUE_STATS, to the
broker holding READ) and the consumer groups for their owners (DESCRIBE_GROUP); an alter
or delete measures the backlog the same way before it asks to remove queues. Clients
never need ZooKeeper: every call goes to brokers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from understudy_broker import protocol as p
from understudy_broker.client import BrokerError, Router, _with_retries
from understudy_broker.model import Permission
from understudy_broker.security import ClientSecurity


def _refused(exc: BrokerError) -> bool:
    """A refusal of this client (not of the broker's state): raised, never retried."""
    return exc.status in (p.Status.NOT_AUTHORIZED, p.Status.AUTHENTICATION_FAILED)


def _holder(route: p.RouteResponse, group: str, need: Permission) -> str | None:
    return next((b.name for b in route.brokers_of(group) if b.holds(need)), None)


async def _stats(router: Router, topic: str, group: str, queues: list[int]
                 ) -> dict[int, p.QueueStats]:
    """The queues' stats from the group's reader (else any broker of the group)."""
    try:
        body = await _with_retries(router, Permission.READ, p.Op.QUEUE_STATS,
                                   p.QueueStatsRequest(topic, queues).encode(), group=group,
                                   retries=1)
    except (BrokerError, ConnectionError, OSError, TimeoutError) as exc:
        if isinstance(exc, BrokerError) and _refused(exc):
            raise
        try:
            body = await _with_retries(router, Permission.NONE, p.Op.QUEUE_STATS,
                                       p.QueueStatsRequest(topic, queues).encode(), group=group,
                                       retries=1)
        except (BrokerError, ConnectionError, OSError, TimeoutError) as exc2:
            if isinstance(exc2, BrokerError) and _refused(exc2):
                raise
            return {}
    return dict(p.QueueStatsResponse.decode(body).queues)


async def describe_topic(bootstrap: Sequence[str], topic: str,
                         security: ClientSecurity | None = None) -> dict[str, Any]:
    """``{topic, groups, queues: [{queue, group, writer, reader, log_end, start,
    consumer_groups: [{consumer_group, owner, committed, lag}]}]}``; an ordered topic adds
    ``send_head``, ``consume_head`` (groups) and ``producers`` (:func:`_producers`)."""
    router = Router(bootstrap, security=security)
    try:
        await router.learn_topic(topic, Permission.NONE)
        route = router.route
        assert route is not None
        live = router.live_queues(topic)
        by_group: dict[str, list[int]] = {}
        for q in live:
            by_group.setdefault(router.group_of(topic, q) or "", []).append(q)
        stats: dict[int, p.QueueStats] = {}
        for group, qs in by_group.items():
            stats.update(await _stats(router, topic, group, qs))
        cgroups = sorted({cg for s in stats.values() for cg in s.committed})
        owners: dict[tuple[str, int], str | None] = {}
        for cg in cgroups:
            try:
                d = p.DescribeGroupResponse.decode(await _with_retries(
                    router, Permission.NONE, p.Op.DESCRIBE_GROUP,
                    p.DescribeGroupRequest(cg).encode(), retries=1))
            except (BrokerError, ConnectionError, OSError, TimeoutError):
                continue
            for o in d.owners:
                if o.get("topic") == topic:
                    owners[(cg, int(o["queue"]))] = str(o["member"])
        queues = []
        for q in live:
            group = router.group_of(topic, q) or ""
            s = stats.get(q)
            end = None if s is None else s.end
            queues.append({
                "queue": q, "group": group,
                "writer": _holder(route, group, Permission.WRITE),
                "reader": _holder(route, group, Permission.READ),
                "log_end": end,
                "start": None if s is None else s.start,
                "consumer_groups": [
                    {"consumer_group": cg, "owner": owners.get((cg, q)),
                     "committed": s.committed.get(cg),
                     "lag": None if end is None or cg not in s.committed
                     else max(0, end - s.committed[cg])}
                    for cg in cgroups if s is not None and cg in s.committed
                ],
            })
        out: dict[str, Any] = {"topic": topic, "groups": list(route.topic_groups.get(topic, [])),
                               "queues": queues}
        ordered, head = router.send_head(topic)
        if ordered:
            out.update(send_head=head, consume_head=route.consume_heads.get(topic),
                       producers=await _producers(router, topic))
        return out
    finally:
        await router.close()


async def _producers(router: Router, topic: str) -> dict[str, Any] | None:
    """The producers of an ordered topic as the brokers hold them: ``{generation, active,
    members}`` (``active``: the member that may send; None while none does)."""
    try:
        d = p.DescribeGroupResponse.decode(await _with_retries(
            router, Permission.NONE, p.Op.DESCRIBE_GROUP,
            p.DescribeGroupRequest(topic, producer=True).encode(), retries=1))
    except (BrokerError, ConnectionError, OSError, TimeoutError):
        return None
    active = next((str(o["member"]) for o in d.owners if o.get("topic") == topic), None)
    return {"generation": d.generation, "active": active,
            "members": sorted(str(m["member"]) for m in d.members)}


def backlog_of(described: dict[str, Any]) -> dict[int, int]:
    """Unconsumed messages per queue: the largest lag over consumer groups, or every
    retained message when no consumer group has committed (unknown queues left out)."""
    out: dict[int, int] = {}
    for q in described["queues"]:
        if q["log_end"] is None:
            continue
        lags = [c["lag"] for c in q["consumer_groups"] if c["lag"] is not None]
        out[q["queue"]] = max(lags) if lags else q["log_end"] - (q["start"] or 0)
    return out


async def admin_topic(bootstrap: Sequence[str], req: p.AdminTopicRequest,
                      security: ClientSecurity | None = None) -> p.AdminTopicResponse:
    """ADMIN_TOPIC through any broker; alter and delete first measure the backlog."""
    if req.action != "create" and req.backlog is None and not req.force:
        described = await describe_topic(bootstrap, req.topic, security)
        req = p.AdminTopicRequest(req.action, req.topic, req.groups, req.queues_per_group,
                                  req.add_groups, req.remove_groups, req.ordered, req.force,
                                  backlog_of(described))
    return p.AdminTopicResponse.decode(
        await _any_broker(bootstrap, security, p.Op.ADMIN_TOPIC, req.encode()))


async def describe_consumer_group(bootstrap: Sequence[str], cgroup: str,
                                  security: ClientSecurity | None = None) -> dict[str, Any]:
    """``{group, generation, members: [...], assignment: [{topic, queue, member, next,
    committed, lag}]}``."""
    d = p.DescribeGroupResponse.decode(await _any_broker(
        bootstrap, security, p.Op.DESCRIBE_GROUP, p.DescribeGroupRequest(cgroup).encode()))
    topics = sorted({str(o["topic"]) for o in d.owners})
    stats: dict[tuple[str, int], p.QueueStats] = {}
    for t in topics:
        described = await describe_topic(bootstrap, t, security)
        for q in described["queues"]:
            for c in q["consumer_groups"]:
                if c["consumer_group"] == cgroup:
                    stats[(t, q["queue"])] = p.QueueStats(q["start"] or 0, q["log_end"] or 0,
                                                          {cgroup: c["committed"]})
            if (t, q["queue"]) not in stats and q["log_end"] is not None:
                stats[(t, q["queue"])] = p.QueueStats(q["start"] or 0, q["log_end"], {})
    assignment = []
    for o in d.owners:
        key = (str(o["topic"]), int(o["queue"]))
        s = stats.get(key)
        committed = None if s is None else s.committed.get(cgroup)
        assignment.append({
            "topic": key[0], "queue": key[1], "member": o["member"], "next": o.get("next"),
            "committed": committed,
            "lag": None if s is None else s.end - (committed or s.start),
        })
    return {"group": cgroup, "generation": d.generation, "members": list(d.members),
            "assignment": assignment}


async def list_consumer_groups(bootstrap: Sequence[str],
                               security: ClientSecurity | None = None) -> list[dict[str, Any]]:
    """``[{group, members, generation}]`` for every consumer group."""
    body = await _any_broker(bootstrap, security, p.Op.LIST_GROUPS,
                             p.ListGroupsRequest().encode())
    return [dict(g) for g in p.ListGroupsResponse.decode(body).groups]


async def security_admin(bootstrap: Sequence[str], req: p.SecurityAdminRequest,
                         security: ClientSecurity | None = None) -> p.SecurityAdminResponse:
    """SECURITY_ADMIN (users and ACLs) through any broker."""
    return p.SecurityAdminResponse.decode(
        await _any_broker(bootstrap, security, p.Op.SECURITY_ADMIN, req.encode()))


async def _any_broker(bootstrap: Sequence[str], security: ClientSecurity | None, op: p.Op,
                      body: bytes) -> bytes:
    """One request to any broker (cluster-wide answers), retried twice; the OK body."""
    router = Router(bootstrap, security=security)
    try:
        return await _with_retries(router, Permission.NONE, op, body, retries=2)
    finally:
        await router.close()
