"""OffsetCommit (key 8), v0-v9.

v0: group + offsets + metadata. v1: generation, member id, per-partition commit timestamp. v2-v4:
retention time instead of commit timestamp. v3: throttle time in the response. v5: retention dropped.
v6: leader epoch. v7: group instance id (static members). v8: first flexible version. v9: unknown
group with a generation answers GROUP_ID_NOT_FOUND instead of ILLEGAL_GENERATION.
No version has a top-level error: a group-level error is repeated on every partition.
"""

from typing import Any

from coordinator.apis import handles
from coordinator.groups.membership import Membership
from coordinator.offsets import (
    CommitRequest,
    PartitionCommit,
    PreparedCommit,
    TopicErrors,
    check_group,
    group_id_error,
    prepare_commit,
    refuse_all,
)
from coordinator.request import Request
from coordinator.runtime import Runtime
from coordinator.shard import OpResult
from coordinator.state import ShardData
from protocol.errors import ErrorCode
from protocol.registry import register

SPEC = register(8, "OffsetCommit", 0, 9)
Response = SPEC.response.cls
Topic = Response.OffsetCommitResponseTopic
Partition = Topic.OffsetCommitResponsePartition


def to_commit_request(version: int, req: Any) -> CommitRequest:
    new = tuple.__new__
    if version >= 6:
        topics = [(t.name, [new(PartitionCommit, (p.partition_index, p.committed_offset, p.committed_leader_epoch, -1,
                                                  p.committed_metadata)) for p in t.partitions]) for t in req.topics]
    else:
        ts_of = (lambda p: p.commit_timestamp) if version == 1 else (lambda p: -1)
        topics = [(t.name, [new(PartitionCommit, (p.partition_index, p.committed_offset, -1, ts_of(p),
                                                  p.committed_metadata)) for p in t.partitions]) for t in req.topics]
    return CommitRequest(
        version=version,
        group_id=req.group_id,
        generation=req.generation_id_or_member_epoch if version >= 1 else -1,
        member_id=(req.member_id or "") if version >= 1 else "",
        group_instance_id=req.group_instance_id if version >= 7 else None,
        retention_ms=req.retention_time_ms if 2 <= version <= 4 else -1,
        topics=topics,
    )


class CommitAnswer:
    """An OffsetCommit response as the handler makes it: every partition's error in request order. It
    stays tuples until encoded (``encode``): the generated objects of a 100-partition answer cost ~18%
    of its event-loop time, and the compiled codec writes the tuples directly."""

    __slots__ = ("results",)

    def __init__(self, results: TopicErrors) -> None:
        self.results = results


def message(answer: CommitAnswer) -> Any:
    """The answer as the generated classes (positional: Partition(partition_index, error_code))."""
    topics = [Topic(name=name, partitions=[Partition(p, e) for p, e in parts]) for name, parts in answer.results]
    return Response(throttle_time_ms=0, topics=topics)


def encode(answer: CommitAnswer, version: int, correlation_id: int) -> bytes:
    if SPEC.hot is not None:
        data: bytes = SPEC.hot.encode_results(answer.results, version, correlation_id)
        return data
    return SPEC.encode_response(message(answer), version, correlation_id)


class _Prepared:
    """The request's group-independent part and, ready for the usual outcome, its response."""

    __slots__ = ("bad_group", "commit", "response")

    def __init__(self, commit: PreparedCommit | None, bad_group: ErrorCode, response: Any) -> None:
        self.commit = commit
        self.bad_group = bad_group
        self.response = response


def prepare(runtime: Runtime, body: Any, version: int) -> _Prepared:
    commit = to_commit_request(version, body)
    bad_group = group_id_error(commit.group_id)
    if bad_group:
        return _Prepared(None, bad_group, CommitAnswer(refuse_all(commit, bad_group)))
    prepared = prepare_commit(commit, runtime.clock.now_ms(), runtime.config.offset_metadata_max_bytes)
    return _Prepared(prepared, bad_group, CommitAnswer(prepared.results))


def error_response(body: Any, version: int, error: ErrorCode) -> Any:
    return CommitAnswer(refuse_all(to_commit_request(version, body), error))


def _commit(data: ShardData, prepared: _Prepared, membership: Membership) -> OpResult:
    commit = prepared.commit
    if commit is None:
        raise ValueError("a commit refused before preparation has nothing to write")
    records, results = check_group(data, commit)
    if results is not commit.results:  # the group refused it
        return OpResult([], CommitAnswer(results))
    group = data.groups.get(commit.request.group_id)
    if group is not None and commit.request.member_id:
        membership.touch(group, commit.request.member_id)  # a member's valid commit is also a heartbeat
    response = prepared.response

    def written_failed(error: ErrorCode) -> None:
        # Only the partitions that were written get the write's error; refused ones keep their own.
        response.results = [(name, [(p, error if e == ErrorCode.NONE else e) for p, e in parts])
                            for name, parts in response.results]

    return OpResult(records, response, written_failed, None, commit.encoded)


def outcome(answer: CommitAnswer) -> tuple[int, int]:
    """(first partition error, partitions committed)."""
    first, ok = 0, 0
    for _, parts in answer.results:
        for _, error in parts:
            if error:
                first = first or error
            else:
                ok += 1
    return first, ok


@handles(SPEC, error_response=error_response, prepare=prepare, outcome=outcome, encode=encode)
def offset_commit(runtime: Runtime, req: Request, prepared: _Prepared) -> Any:
    if prepared.commit is None:
        return prepared.response
    group_id = prepared.commit.request.group_id
    return runtime.shard_for(group_id).write(req, _commit, prepared, runtime.groups_for(group_id).membership)
