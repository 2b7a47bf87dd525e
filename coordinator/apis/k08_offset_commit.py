"""OffsetCommit (key 8), v0-v9.

v0: group + offsets + metadata. v1: generation, member id, per-partition commit timestamp. v2-v4:
retention time instead of commit timestamp. v3: throttle time in the response. v5: retention dropped.
v6: leader epoch. v7: group instance id (static members). v8: first flexible version. v9: unknown
group with a generation answers GROUP_ID_NOT_FOUND instead of ILLEGAL_GENERATION.
No version has a top-level error: a group-level error is repeated on every partition.
"""

from typing import Any

from coordinator.apis import Reply, RequestContext, handles
from coordinator.offsets import (
    CommitRequest,
    PartitionCommit,
    TopicErrors,
    commit_offsets,
    group_id_error,
    refuse_all,
)
from coordinator.runtime import Runtime
from coordinator.shard import now_ms
from protocol.errors import ErrorCode
from protocol.registry import OFFSET_COMMIT, OffsetCommitResponse

Topic = OffsetCommitResponse.OffsetCommitResponseTopic
Partition = Topic.OffsetCommitResponsePartition


def to_commit_request(version: int, req: Any) -> CommitRequest:
    def partition(p: Any) -> PartitionCommit:
        epoch = p.committed_leader_epoch if version >= 6 else -1
        ts = p.commit_timestamp if version == 1 else -1
        return PartitionCommit(p.partition_index, p.committed_offset, epoch, ts, p.committed_metadata)

    return CommitRequest(
        version=version,
        group_id=req.group_id,
        generation=req.generation_id_or_member_epoch if version >= 1 else -1,
        member_id=(req.member_id or "") if version >= 1 else "",
        group_instance_id=req.group_instance_id if version >= 7 else None,
        retention_ms=req.retention_time_ms if 2 <= version <= 4 else -1,
        topics=[(t.name, [partition(p) for p in t.partitions]) for t in req.topics],
    )


def build_response(results: TopicErrors) -> Any:
    topics = [
        Topic(name=name, partitions=[Partition(partition_index=p, error_code=e) for p, e in parts])
        for name, parts in results
    ]
    return OffsetCommitResponse(throttle_time_ms=0, topics=topics)


def set_all_errors(response: Any, error: ErrorCode) -> None:
    for topic in response.topics:
        for p in topic.partitions:
            p.error_code = error


@handles(OFFSET_COMMIT)
def offset_commit(runtime: Runtime, ctx: RequestContext, req: Any) -> Reply:
    commit = to_commit_request(ctx.api_version, req)
    bad_group = group_id_error(commit.group_id)
    if bad_group:
        return Reply(build_response(refuse_all(commit, bad_group)))
    shard = runtime.shard_for(commit.group_id)
    if shard.error is not None:
        return Reply(build_response(refuse_all(commit, shard.error)))
    records, results = commit_offsets(shard.data, commit, now_ms(), runtime.config.offset_metadata_max_bytes)
    response = build_response(results)
    if not records:
        return Reply(response)
    runtime.metrics.offsets_committed(len(records))
    durable = shard.append(records)
    return Reply(response, [(durable, lambda: set_all_errors(response, ErrorCode.NOT_COORDINATOR))])
