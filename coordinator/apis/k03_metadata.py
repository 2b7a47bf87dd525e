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
from coordinator.request import Request
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


def _unknown(name: str | None, topic_id: Any, error: ErrorCode = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION) -> Any:
    return Topic(error_code=error, name=name, topic_id=topic_id or _NO_ID, is_internal=False, partitions=[])


def error_response(body: Any, version: int, error: ErrorCode) -> Any:
    return MetadataResponse(throttle_time_ms=0, brokers=[], topics=[
        _unknown(t.name, getattr(t, "topic_id", None), error) for t in (body.topics or [])])


@handles(SPEC, error_response=error_response)
def metadata(runtime: Runtime, req: Request, body: Any) -> Any:
    host, port = runtime.config.advertised
    node = runtime.config.node_id
    requested = body.topics
    everything = requested is None or (req.version == 0 and not requested)
    if everything:
        topics = [_offsets_topic(runtime)]
    else:
        topics = [
            _offsets_topic(runtime) if t.name == OFFSETS_TOPIC else _unknown(t.name, getattr(t, "topic_id", None))
            for t in requested
        ]
    broker = MetadataResponse.MetadataResponseBroker(node_id=node, host=host, port=port, rack=None)
    return MetadataResponse(throttle_time_ms=0, brokers=[broker], cluster_id=CLUSTER_ID, controller_id=node,
                            topics=topics)
