"""OffsetFetch (key 9), v0-v9.

v0: group + topics (v0 read ZooKeeper in Kafka; kcoord serves it from the log like v1). v1: same.
v2: null topics = all partitions with an offset; top-level error code. v3: throttle time.
v5: leader epoch. v6: first flexible version. v7: require_stable (KIP-447). v8: many groups per
request, errors per group. v9: member id and epoch (KIP-848 members; classic groups ignore them).
v0-v1 have no group-level error field: a group error is put on every requested partition.
"""

from typing import Any

from coordinator.apis import Reply, RequestContext, handles
from coordinator.offsets import TopicOffsets, fetch_offsets
from coordinator.runtime import Runtime
from protocol.errors import ErrorCode
from protocol.registry import OFFSET_FETCH, OffsetFetchResponse

Group = OffsetFetchResponse.OffsetFetchResponseGroup
GroupTopic = Group.OffsetFetchResponseTopics
GroupPartition = GroupTopic.OffsetFetchResponsePartitions
Topic = OffsetFetchResponse.OffsetFetchResponseTopic
Partition = Topic.OffsetFetchResponsePartition

Requested = list[tuple[str, list[int]]] | None


def _partition(cls: Any, p: int, offset: int, epoch: int, metadata: str, error: int) -> Any:
    return cls(partition_index=p, committed_offset=offset, committed_leader_epoch=epoch, metadata=metadata,
               error_code=error)


def _topics(topic_cls: Any, part_cls: Any, offsets: TopicOffsets) -> list[Any]:
    out = []
    for name, parts in offsets:
        entries = [
            _partition(part_cls, e.partition, e.value.offset, e.value.leader_epoch, e.value.metadata, e.error)
            if e.value is not None
            else _partition(part_cls, e.partition, -1, -1, "", e.error)
            for e in parts
        ]
        out.append(topic_cls(name=name, partitions=entries))
    return out


def _errored(requested: Requested, error: ErrorCode) -> list[Any]:
    """v0-v1 carry a group error on every requested partition (offset -1), as older Kafka did."""
    return [
        Topic(name=name, partitions=[_partition(Partition, p, -1, -1, "", error) for p in parts])
        for name, parts in (requested or [])
    ]


class _GroupFetch:
    """One group's part of a request: answered now, or after its shard's pending write is durable."""

    def __init__(self, runtime: Runtime, group_id: str, requested: Requested, require_stable: bool) -> None:
        shard = runtime.shard_for(group_id)
        self.error = shard.error
        self.offsets: TopicOffsets = []
        self.barrier = None
        if self.error is None:
            self.offsets = fetch_offsets(shard.data, group_id, requested, require_stable)
            self.barrier = shard.barrier()


def _requested(topics: Any) -> Requested:
    return None if topics is None else [(t.name, list(t.partition_indexes)) for t in topics]


@handles(OFFSET_FETCH)
def offset_fetch(runtime: Runtime, ctx: RequestContext, req: Any) -> Reply:
    v = ctx.api_version
    stable = bool(req.require_stable) if v >= 7 else False
    if v >= 8:
        return _fetch_groups(runtime, req, stable)
    requested = _requested(req.topics)
    fetch = _GroupFetch(runtime, req.group_id, requested, stable)
    response = OffsetFetchResponse(throttle_time_ms=0, topics=[], error_code=0)

    def fail(error: ErrorCode) -> None:
        if v >= 2:
            response.topics, response.error_code = [], error
        else:
            response.topics = _errored(requested, error)

    if fetch.error is not None:
        fail(fetch.error)
        return Reply(response)
    response.topics = _topics(Topic, Partition, fetch.offsets)
    if fetch.barrier is None:
        return Reply(response)
    return Reply(response, [(fetch.barrier, lambda: fail(ErrorCode.NOT_COORDINATOR))])


def _fetch_groups(runtime: Runtime, req: Any, stable: bool) -> Reply:
    groups: list[Any] = []
    reply = Reply(OffsetFetchResponse(throttle_time_ms=0, groups=groups))
    for g in req.groups:
        fetch = _GroupFetch(runtime, g.group_id, _requested(g.topics), stable)
        entry = Group(group_id=g.group_id, topics=_topics(GroupTopic, GroupPartition, fetch.offsets),
                      error_code=fetch.error or 0)
        groups.append(entry)
        if fetch.barrier is not None:
            reply.waits.append((fetch.barrier, _failer(entry)))
    return reply


def _failer(entry: Any) -> Any:
    def fail() -> None:
        entry.topics, entry.error_code = [], ErrorCode.NOT_COORDINATOR

    return fail
