"""OffsetCommit (key 8), v0-v9.

v0: group + offsets + metadata. v1: generation, member id, per-partition commit timestamp. v2-v4:
retention time instead of commit timestamp. v3: throttle time in the response. v5: retention dropped.
v6: leader epoch. v7: group instance id (static members). v8: first flexible version. v9: unknown
group with a generation answers GROUP_ID_NOT_FOUND instead of ILLEGAL_GENERATION.
No version has a top-level error: a group-level error is repeated on every partition.
"""

from typing import Any, Final

from coordinator.apis import handles
from coordinator.groups.membership import Membership
from coordinator.offsets import (
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
from protocol.commit import CommitRequest, from_message
from protocol.errors import ErrorCode
from protocol.registry import register

# Enum members as C variables, not class attributes (tests/protocol/test_compiled.py says why).
_ERR_NONE: Final = ErrorCode.NONE

SPEC: Final = register(8, "OffsetCommit", 0, 9)
Response = SPEC.response.cls
Topic = Response.OffsetCommitResponseTopic
Partition = Topic.OffsetCommitResponsePartition
_new: Final = tuple.__new__


def decode(frame: bytes, version: int) -> tuple[str, CommitRequest]:
    """The request straight from the frame where the compiled codec serves (protocol/hotcodec.py), else
    from the generated message object."""
    hot = SPEC.hot
    if hot is not None:
        decoded: tuple[str, CommitRequest] = SPEC.hot_decoded(hot.decode_commit, frame, version)
        return decoded
    client_id, body = SPEC.decode_request(frame, version)
    return client_id, from_message(version, body)


class CommitAnswer:
    """An OffsetCommit response as the handler makes it: every partition's error in request order. It
    stays tuples until encoded (``encode``): the generated objects of a 100-partition answer cost ~18%
    of its event-loop time, and the compiled codec writes the tuples directly."""

    __slots__ = ("counted", "results")

    def __init__(self, results: TopicErrors, counted: tuple[int, int] | None = None) -> None:
        self.results = results
        # ``outcome``, when the preparation counted it (the walk cost ~2% of a 100-partition commit)
        self.counted = counted

    def written_failed(self, error: ErrorCode) -> None:
        """The fix-up when the write fails: only the partitions that were written get its error;
        refused ones keep their own."""
        self.counted = None
        self.results = [(name, [(p, error if e == _ERR_NONE else e) for p, e in parts])
                        for name, parts in self.results]


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


def prepare(runtime: Runtime, commit: CommitRequest, version: int) -> _Prepared:
    bad_group = group_id_error(commit.group_id)
    if bad_group:
        return _Prepared(None, bad_group, CommitAnswer(refuse_all(commit, bad_group)))
    prepared = prepare_commit(commit, runtime.clock.now_ms(), runtime.config.offset_metadata_max_bytes)
    return _Prepared(prepared, bad_group,
                     CommitAnswer(prepared.results, (prepared.first_error, len(prepared.records))))


def error_response(commit: CommitRequest, version: int, error: ErrorCode) -> Any:
    return CommitAnswer(refuse_all(commit, error))


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
    response: CommitAnswer = prepared.response
    # tuple.__new__: compiled, the NamedTuple's own constructor is an interpreted frame
    result: OpResult = _new(OpResult, (records, response, response.written_failed, None, commit.encoded, True))
    return result


def outcome(answer: CommitAnswer) -> tuple[int, int]:
    """(first partition error, partitions committed)."""
    if answer.counted is not None:
        return answer.counted
    first, ok = 0, 0
    for _, parts in answer.results:
        for _, error in parts:
            if error:
                first = first or error
            else:
                ok += 1
    return first, ok


@handles(SPEC, error_response=error_response, prepare=prepare, outcome=outcome, encode=encode, decode=decode)
def offset_commit(runtime: Runtime, req: Request, prepared: _Prepared) -> Any:
    if prepared.commit is None:
        return prepared.response
    group_id = prepared.commit.request.group_id
    shard = runtime.shard_for(group_id)  # shard.write(req, _commit, ...), with _commit called directly
    shard.writable()
    return shard.write_result(req, _commit(shard.data, prepared, runtime.groups_for(group_id).membership))
