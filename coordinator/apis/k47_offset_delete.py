"""OffsetDelete (key 47), v0 (KIP-496).

A group's committed offsets for some partitions are deleted (tombstones), unless the group still
subscribes to the topic (GROUP_SUBSCRIBED_TO_TOPIC, found by decoding members' subscriptions with
Kafka's ConsumerProtocolSubscription schema). A group with members that is not a consumer group is
NON_EMPTY_GROUP; an unknown group GROUP_ID_NOT_FOUND.
"""

from typing import Any, NamedTuple

from coordinator.apis import handles, outcome
from coordinator.groups.admin import delete_offsets
from coordinator.request import Request
from coordinator.runtime import Runtime
from coordinator.shard import OpResult
from coordinator.state import ShardData
from protocol.errors import ErrorCode
from protocol.registry import register

SPEC = register(47, "OffsetDelete", 0, 0)
Response = SPEC.response.cls
Topic = Response.OffsetDeleteResponseTopic
Partition = Topic.OffsetDeleteResponsePartition


def error_response(body: Any, version: int, error: ErrorCode) -> Any:
    return Response(error_code=error, throttle_time_ms=0, topics=[])


class Deleted(NamedTuple):
    """The answer, and how many committed offsets it removed: a partition named that had none answers
    NONE too (as in Kafka), but kcoord_offset_deletions_total counts offsets removed, as Kafka's
    OffsetDeletions does. It counted every partition answered NONE: 10 partitions named for a group's
    one offset counted 10, and asking again 10 more, with nothing deleted (an operator's audit)."""

    response: Any
    removed: int


def _delete(data: ShardData, group_id: str, topics: list[tuple[str, list[int]]]) -> OpResult:
    result = delete_offsets(data, group_id, topics)
    group_error, per_topic = result.response
    response = Response(error_code=group_error, throttle_time_ms=0, topics=[
        Topic(name=name, partitions=[Partition(partition_index=p, error_code=e) for p, e in parts])
        for name, parts in per_topic
    ])
    return result._replace(response=Deleted(response, len(result.records)))  # each record a tombstone


def _outcome(reply: Any) -> tuple[int, int]:
    if isinstance(reply, Deleted):
        return outcome(reply.response)[0], reply.removed
    return outcome(reply)  # an error response: nothing removed


def _encode(reply: Any, version: int, correlation_id: int) -> bytes:
    return SPEC.encode_response(reply.response if isinstance(reply, Deleted) else reply, version, correlation_id)


@handles(SPEC, error_response=error_response, outcome=_outcome, encode=_encode)
def offset_delete(runtime: Runtime, req: Request, body: Any) -> Any:
    if not body.group_id:
        return error_response(body, req.version, ErrorCode.INVALID_GROUP_ID)
    topics = [(t.name, [p.partition_index for p in t.partitions]) for t in body.topics]
    return runtime.shard_for(body.group_id).write(req, _delete, body.group_id, topics)
