"""Metadata (key 3), v0-v12.

v0: brokers + topics (an empty topic list means all topics). v1: rack, controller id, is-internal;
a null topic list means all topics, an empty one none. v2: cluster id. v3: throttle time. v5: offline
replicas. v7: leader epoch. v8: authorized operations. v9: first flexible version. v10: topic ids.
v11: drops cluster authorized operations. v12: topic name nullable (lookup by id).
kcoord is a one-node cluster hosting only ``__consumer_offsets``; any other topic is answered
UNKNOWN_TOPIC_OR_PARTITION, never invented.
"""

import uuid
from typing import Any

from coordinator.apis import handles
from coordinator.request import Lazy, Request
from coordinator.runtime import OFFSETS_TOPIC, Runtime
from protocol.errors import ErrorCode
from protocol.registry import register

SPEC = register(3, "Metadata", 0, 12)
MetadataResponse = SPEC.response.cls

CLUSTER_ID = "kcoord"
OFFSETS_TOPIC_ID = uuid.uuid5(uuid.NAMESPACE_URL, "kcoord:" + OFFSETS_TOPIC)
_NO_ID = uuid.UUID(int=0)
Topic = MetadataResponse.MetadataResponseTopic
Partition = Topic.MetadataResponsePartition


def _offsets_topic(runtime: Runtime) -> Any:
    node = runtime.config.node_id
    partitions = [
        Partition(error_code=0, partition_index=p, leader_id=node, leader_epoch=0,
                  replica_nodes=[node], isr_nodes=[node], offline_replicas=[])
        for p in range(runtime.config.offsets_partitions)
    ]
    return Topic(error_code=0, name=OFFSETS_TOPIC, topic_id=OFFSETS_TOPIC_ID, is_internal=True,
                 partitions=partitions)


def _unknown(name: str | None, topic_id: Any, version: int,
             error: ErrorCode = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION) -> Any:
    # Before v12 a response topic has a name, even when the request looked one up by id (name null).
    shown = name if name is not None or version >= 12 else ""
    return Topic(error_code=error, name=shown, topic_id=topic_id or _NO_ID, is_internal=False, partitions=[])


def _distinct(requested: Any) -> list[Any]:
    """Each requested topic once, in request order (Kafka answers a set: naming a topic twice does not
    make the answer twice as large)."""
    seen: set[tuple[Any, Any]] = set()
    out = []
    for t in requested:
        key = (t.name, getattr(t, "topic_id", None))
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out


def error_response(body: Any, version: int, error: ErrorCode) -> Any:
    return MetadataResponse(throttle_time_ms=0, brokers=[], topics=[
        _unknown(t.name, getattr(t, "topic_id", None), version, error) for t in _distinct(body.topics or [])])


@handles(SPEC, error_response=error_response)
def metadata(runtime: Runtime, req: Request, body: Any) -> Any:
    if req.large:  # thousands of topics: the answer is built where it is encoded, off the event loop
        return Lazy(_answer, runtime, req.version, body)
    return _answer(runtime, req.version, body)


def _answer(runtime: Runtime, version: int, body: Any) -> Any:
    host, port = runtime.config.advertised
    node = runtime.config.node_id
    requested = body.topics
    everything = requested is None or (version == 0 and not requested)
    if everything:
        topics = [_offsets_topic(runtime)]
    else:
        topics = [
            _offsets_topic(runtime) if t.name == OFFSETS_TOPIC
            else _unknown(t.name, getattr(t, "topic_id", None), version)
            for t in _distinct(requested)
        ]
    broker = MetadataResponse.MetadataResponseBroker(node_id=node, host=host, port=port, rack=None)
    return MetadataResponse(throttle_time_ms=0, brokers=[broker], cluster_id=CLUSTER_ID, controller_id=node,
                            topics=topics)
