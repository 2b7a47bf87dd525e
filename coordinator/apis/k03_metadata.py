"""Metadata (key 3), v0-v12.

v0: brokers + topics (an empty topic list means all topics). v1: rack, controller id, is-internal;
a null topic list means all topics, an empty one none. v2: cluster id. v3: throttle time. v5: offline
replicas. v7: leader epoch. v8: authorized operations. v9: first flexible version. v10: topic ids.
v11: drops cluster authorized operations. v12: topic name nullable (lookup by id).
kcoord is a cluster (of one node, but in cluster mode: coordinator.cluster) hosting only
``__consumer_offsets``, each partition led by the node coordinating its groups; any other topic is answered
UNKNOWN_TOPIC_OR_PARTITION, never invented. Topic ids as Kafka's KafkaApis.handleTopicMetadataRequest
takes them: from v12 a request naming any id is answered by id (UNKNOWN_TOPIC_ID for an id not known,
with a null name; the names it carries are then not looked at), and before v12 a request naming an id
or a null name is refused (INVALID_REQUEST). Authorized operations, when asked for, are every operation
Kafka supports on the resource, as a broker without an authorizer answers.
"""

import uuid
from typing import Any, NamedTuple

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
# Bits of the AclOperation codes Kafka supports on a topic (READ 3, WRITE 4, CREATE 5, DELETE 6, ALTER 7,
# DESCRIBE 8, DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11) and on the cluster (CREATE 5, ALTER 7, DESCRIBE 8,
# CLUSTER_ACTION 9, DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11, IDEMPOTENT_WRITE 12): AclEntry.supportedOperations.
TOPIC_OPERATIONS = sum(1 << op for op in (3, 4, 5, 6, 7, 8, 10, 11))
CLUSTER_OPERATIONS = sum(1 << op for op in (5, 7, 8, 9, 10, 11, 12))
Topic = MetadataResponse.MetadataResponseTopic
Partition = Topic.MetadataResponsePartition


def _offsets_topic(runtime: Runtime) -> Any:
    """Each partition led by the node coordinating its groups (this one, but in cluster mode)."""
    partitions = [
        Partition(error_code=0, partition_index=p, leader_id=node, leader_epoch=0,
                  replica_nodes=[node], isr_nodes=[node], offline_replicas=[])
        for p, node in enumerate(runtime.config.leaders())
    ]
    return Topic(error_code=0, name=OFFSETS_TOPIC, topic_id=OFFSETS_TOPIC_ID, is_internal=True,
                 partitions=partitions)


def _unknown(name: str | None, topic_id: Any, version: int,
             error: ErrorCode = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION) -> Any:
    # Before v12 a response topic has a name, even when the request looked one up by id (name null).
    shown = name if name is not None or version >= 12 else ""
    return Topic(error_code=error, name=shown, topic_id=topic_id or _NO_ID, is_internal=False, partitions=[])


def unknown_topic_id(topic_id: uuid.UUID) -> Any:
    """A v12+ request's topic id the cluster does not know: UNKNOWN_TOPIC_ID with a null name."""
    return Topic(error_code=ErrorCode.UNKNOWN_TOPIC_ID, name=None, topic_id=topic_id, is_internal=False,
                 partitions=[])


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


class Lookup(NamedTuple):
    """What a Metadata request asks for, read as KafkaApis.handleTopicMetadataRequest reads it: every
    topic; or nothing but INVALID_REQUEST (``invalid``: before v12, a topic id or a null name); or, from
    v12, the topics of the ids it names (``ids``, distinct; its names are then not looked at); else the
    topics it names (``names``, each once)."""

    everything: bool = False
    invalid: bool = False
    ids: tuple[uuid.UUID, ...] = ()
    names: tuple[str | None, ...] = ()


def every_topic_asked(topics: list[Any] | None, version: int) -> bool:
    """Whether a Metadata request's topic list asks for every topic: null, or at v0 empty."""
    return topics is None or (version == 0 and not topics)


def lookup(body: Any, version: int) -> Lookup:
    requested = body.topics
    if every_topic_asked(requested, version):
        return Lookup(everything=True)
    ids = () if version < 10 else _topic_ids(requested)
    if version < 12 and (ids or any(t.name is None for t in requested)):  # ids, or a lookup by id
        return Lookup(invalid=True)
    if ids:
        return Lookup(ids=ids)
    return Lookup(names=tuple(t.name for t in _distinct(requested)))


def authorized_operations(body: Any, version: int, topics: list[Any]) -> int:
    """Authorized operations, when the request asks for them, as a broker without an authorizer answers:
    set on ``topics`` (every operation Kafka supports on a topic); returned for the cluster (v8-v10),
    else the schema's default."""
    if version >= 8 and body.include_topic_authorized_operations:
        for topic in topics:
            if topic.error_code != ErrorCode.UNKNOWN_TOPIC_ID:  # Kafka sets none on those
                topic.topic_authorized_operations = TOPIC_OPERATIONS
    return CLUSTER_OPERATIONS if 8 <= version <= 10 and body.include_cluster_authorized_operations else -(1 << 31)


def error_response(body: Any, version: int, error: ErrorCode) -> Any:
    return MetadataResponse(throttle_time_ms=0, brokers=[], topics=[
        _unknown(t.name, getattr(t, "topic_id", None), version, error) for t in _distinct(body.topics or [])])


@handles(SPEC, error_response=error_response)
def metadata(runtime: Runtime, req: Request, body: Any) -> Any:
    if req.large:  # thousands of topics: the answer is built where it is encoded, off the event loop
        return Lazy(_answer, runtime, req.version, body)
    return _answer(runtime, req.version, body)


def _answer(runtime: Runtime, version: int, body: Any) -> Any:
    asked = lookup(body, version)
    if asked.invalid:
        return error_response(body, version, ErrorCode.INVALID_REQUEST)
    if asked.everything:
        topics = [_offsets_topic(runtime)]
    elif asked.ids:
        topics = [_offsets_topic(runtime) if i == OFFSETS_TOPIC_ID else unknown_topic_id(i) for i in asked.ids]
    else:
        topics = [_offsets_topic(runtime) if name == OFFSETS_TOPIC else _unknown(name, None, version)
                  for name in asked.names]
    cluster_operations = authorized_operations(body, version, topics)
    nodes = runtime.config.nodes  # in cluster mode every node, each answering for its partitions' groups
    brokers = [MetadataResponse.MetadataResponseBroker(node_id=n.node_id, host=n.host, port=n.port, rack=None)
               for n in nodes]
    return MetadataResponse(throttle_time_ms=0, brokers=brokers, cluster_id=CLUSTER_ID,
                            controller_id=nodes[0].node_id, topics=topics,
                            cluster_authorized_operations=cluster_operations)


def _topic_ids(requested: Any) -> tuple[uuid.UUID, ...]:
    """The distinct non-zero topic ids a v10+ request names, in request order."""
    return tuple(dict.fromkeys(t.topic_id for t in requested if t.topic_id is not None and t.topic_id != _NO_ID))
