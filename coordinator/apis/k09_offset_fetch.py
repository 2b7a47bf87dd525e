"""OffsetFetch (key 9), v0-v9.

v0: group + topics (v0 read ZooKeeper in Kafka; kcoord serves it from the log like v1). v1: same.
v2: null topics = all partitions with an offset; top-level error code. v3: throttle time.
v5: leader epoch. v6: first flexible version. v7: require_stable (KIP-447). v8: many groups per
request, errors per group. v9: member id and epoch (KIP-848 members; classic groups ignore them).
v0-v1 have no group-level error field: a group error is put on every requested partition.
"""

from typing import Any

from coordinator.apis import handles
from coordinator.offsets import TopicOffsets, fetch_offsets
from coordinator.request import Lazy, Request, ShardUnavailable
from coordinator.runtime import Runtime
from protocol.errors import ErrorCode
from protocol.registry import register

SPEC = register(9, "OffsetFetch", 0, 9)
Response = SPEC.response.cls
Group = Response.OffsetFetchResponseGroup
GroupTopic = Group.OffsetFetchResponseTopics
GroupPartition = GroupTopic.OffsetFetchResponsePartitions
Topic = Response.OffsetFetchResponseTopic
Partition = Topic.OffsetFetchResponsePartition

Requested = list[tuple[str, list[int]]] | None


def _topics(topic_cls: Any, part_cls: Any, offsets: TopicOffsets) -> list[Any]:
    out = []
    for name, parts in offsets:
        entries = []
        for partition, v, error in parts:
            if v is not None:
                entries.append(part_cls(partition, v.offset, v.leader_epoch, v.metadata, error))
            else:
                entries.append(part_cls(partition, -1, -1, "", error))
        out.append(topic_cls(name=name, partitions=entries))
    return out


def _response(offsets: TopicOffsets) -> Any:
    return Response(topics=_topics(Topic, Partition, offsets), error_code=0)


def _requested(topics: Any) -> Requested:
    return None if topics is None else [(t.name, list(t.partition_indexes)) for t in topics]


def error_response(body: Any, version: int, error: ErrorCode) -> Any:
    if version >= 8:
        return Response(groups=[Group(group_id=g.group_id, topics=[], error_code=error) for g in body.groups])
    if version >= 2:
        return Response(topics=[], error_code=error)
    # v0-v1 carry a group error on every requested partition (offset -1), as older Kafka did.
    return Response(topics=[
        Topic(name=name, partitions=[Partition(partition_index=p, committed_offset=-1, committed_leader_epoch=-1,
                                               metadata="", error_code=error) for p in parts])
        for name, parts in (_requested(body.topics) or [])
    ])


@handles(SPEC, error_response=error_response)
def offset_fetch(runtime: Runtime, req: Request, body: Any) -> Any:
    v = req.version
    stable = bool(body.require_stable) if v >= 7 else False
    if v >= 8:
        return _fetch_groups(runtime, req, body, stable)
    shard = runtime.shard_for(body.group_id)
    offsets = shard.read(req, None, fetch_offsets, body.group_id, _requested(body.topics), stable)
    return Lazy(_response, offsets) if req.large else _response(offsets)


def _fetch_groups(runtime: Runtime, req: Request, body: Any, stable: bool) -> Any:
    groups: list[Any] = []
    for g in body.groups:
        entry = Group(group_id=g.group_id, topics=[], error_code=0)
        groups.append(entry)
        try:
            offsets = runtime.shard_for(g.group_id).read(req, _failer(entry), fetch_offsets, g.group_id,
                                                         _requested(g.topics), stable)
        except ShardUnavailable as exc:
            entry.error_code = exc.error
            continue
        entry.topics = _topics(GroupTopic, GroupPartition, offsets)
    return Response(groups=groups)


def _failer(entry: Any) -> Any:
    def fail(error: ErrorCode) -> None:
        entry.topics, entry.error_code = [], error

    return fail
