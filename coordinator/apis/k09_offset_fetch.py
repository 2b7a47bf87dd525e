"""OffsetFetch (key 9), v0-v9.

v0: group + topics (v0 read ZooKeeper in Kafka; kcoord serves it from the log like v1). v1: same.
v2: null topics = all partitions with an offset; top-level error code. v3: throttle time.
v5: leader epoch. v6: first flexible version. v7: require_stable (KIP-447). v8: many groups per
request, errors per group. v9: member id and epoch (KIP-848 members; classic groups ignore them).
v0-v1 have no group-level error field: a group error is put on every requested partition.
"""

import asyncio
import logging
from collections.abc import Iterable
from typing import Any, Final

from coordinator.apis import handles
from coordinator.offsets import LARGE_FETCH, OffsetsCopy, TopicOffsets, copied_offsets, read_offsets
from coordinator.request import Fixup, Lazy, Request, ShardUnavailable
from coordinator.runtime import Runtime
from coordinator.shard import Shard
from coordinator.state import offset_value
from protocol.errors import ErrorCode
from protocol.hotcodec import YIELD_EVERY, offer_gil
from protocol.offsetfetch import FetchRequest, Requested, from_message
from protocol.registry import register
from protocol.schema import ZERO_UUID

# Enum members as C variables, not class attributes (tests/protocol/test_compiled.py says why).
_ERR_NONE: Final = ErrorCode.NONE
_ERR_UNKNOWN_SERVER_ERROR: Final = ErrorCode.UNKNOWN_SERVER_ERROR

SPEC: Final = register(9, "OffsetFetch", 0, 9)
Response = SPEC.response.cls
Group = Response.OffsetFetchResponseGroup
GroupTopic = Group.OffsetFetchResponseTopics
GroupPartition = GroupTopic.OffsetFetchResponsePartitions
Topic = Response.OffsetFetchResponseTopic
Partition = Topic.OffsetFetchResponsePartition

log = logging.getLogger(__name__)


class FetchAnswer:
    """An OffsetFetch response as the handler makes it: per group ``[group_id, error, offsets]``, in
    request order (v0-v7: the one group, whose error is the response's; v0-v1 have no such field, so
    their errors are on the partitions). It stays lists and tuples until encoded (``encode``): the
    compiled codec writes them directly, and only the pure-Python path builds the generated objects."""

    __slots__ = ("groups",)

    def __init__(self, groups: list[list[Any]]) -> None:
        self.groups = groups


def _topics(topic_cls: Any, part_cls: Any, offsets: TopicOffsets) -> list[Any]:
    # Positional: the generated classes take their schema fields in order, Partition(partition_index,
    # committed_offset, committed_leader_epoch, metadata, error_code), and a v8+ GroupTopic(name,
    # topic_id, partitions) has a topic id (v10) before its partitions.
    grouped = topic_cls is GroupTopic
    out = []
    for name, parts in offsets:
        entries = []
        for partition, stored, error in parts:
            if stored is not None:
                v = offset_value(stored)
                entries.append(part_cls(partition, v.offset, v.leader_epoch, v.metadata, error))
            else:
                entries.append(part_cls(partition, -1, -1, "", error))
        out.append(topic_cls(name, ZERO_UUID, entries) if grouped else topic_cls(name, entries))
    return out


def message(answer: FetchAnswer, version: int) -> Any:
    """The answer as the generated classes: the pure-Python path, and the tests' reference."""
    if version >= 8:
        return Response(groups=[Group(gid, _topics(GroupTopic, GroupPartition, offsets), error)
                                for gid, error, offsets in answer.groups])
    _, error, offsets = answer.groups[0]
    return Response(topics=_topics(Topic, Partition, offsets), error_code=error)


class BuiltAnswer(FetchAnswer):
    """An answer ``_built`` for a large request on the bulk thread, from copies of large groups'
    offsets or for thousands of groups; ``copied``: the indexes of the groups whose offsets it built
    (and alone owns). Freed a slice at a time where it is encoded (``_drain``)."""

    __slots__ = ("copied",)

    def __init__(self, groups: list[list[Any]], copied: list[int]) -> None:
        super().__init__(groups)
        self.copied = copied


def encode(answer: FetchAnswer, version: int, correlation_id: int) -> bytes:
    if SPEC.hot is not None:
        data: bytes = SPEC.hot.encode_answer(answer.groups, version, correlation_id)
    else:
        data = SPEC.encode_response(message(answer, version), version, correlation_id)
    if isinstance(answer, BuiltAnswer):
        _drain(answer)
    return data


def _drain(answer: BuiltAnswer) -> None:
    """Where a built answer is encoded (the bulk thread for a large request; the event loop for one of
    more than 4,096 groups in under 64 KiB), once it is: frees the offsets it built, then its groups, a
    slice at a time, offering the GIL in between (freed whole, 150k entries held it for ~17 ms, the
    100k groups of one v8 request ~30 ms). Other groups' offsets are the request's and stay as they
    are; the groups list and its entries are the answer's own."""
    _free(*[parts for i in answer.copied for _, parts in answer.groups[i][2]], answer.groups)


def _free(*lists: list[Any]) -> None:
    """Empties the lists a slice at a time, offering the GIL after every YIELD_EVERY items freed, however
    they are split between lists (a request's 100k groups are 50 shards' lists of 2,000)."""
    pending = 0
    for items in lists:
        while items:
            n = min(len(items), YIELD_EVERY - pending)
            del items[-n:]
            pending += n
            if pending == YIELD_EVERY:
                offer_gil(YIELD_EVERY)
                pending = 0


def decode(frame: bytes, version: int) -> tuple[str, FetchRequest]:
    """The request straight from the frame where the compiled codec serves (protocol/hotcodec.py), else
    from the generated message object."""
    hot = SPEC.hot
    if hot is not None:
        decoded: tuple[str, FetchRequest] = SPEC.hot_decoded(hot.decode_fetch, frame, version)
        return decoded
    client_id, body = SPEC.decode_request(frame, version)
    return client_id, from_message(version, body)


def error_response(body: FetchRequest, version: int, error: ErrorCode) -> FetchAnswer:
    if version >= 8:
        return FetchAnswer([[g.group_id, error, []] for g in body.groups])
    if version >= 2:
        return FetchAnswer([[body.group_id, error, []]])
    # v0-v1 carry a group error on every requested partition (offset -1), as older Kafka did.
    requested = body.topics or []
    return FetchAnswer([[body.group_id, _ERR_NONE, [(name, [(p, None, error) for p in parts])
                                                         for name, parts in requested]]])


class _Groups:
    """A v8+ request's groups bucketed by shard (computed off the event loop for a large request), and
    per group its error and offsets, filled as the shards answer and turned into the response when
    it is encoded (so a failed barrier can still change a group's part)."""

    __slots__ = ("answered", "asked", "by_shard", "ids", "results", "same", "times")

    def __init__(self, runtime: Runtime, body: FetchRequest) -> None:
        self.asked: list[Any] = body.groups
        self.ids = [g.group_id for g in body.groups]
        self.by_shard: dict[int, list[tuple[int, str, Requested]]] = {}
        # A group named again for all its offsets is read once and answered with the first one's part:
        # 4 bytes a name made a 16 KiB request read one group's 2,000 offsets 4,000 times on the event
        # loop (a fuzzing campaign's find). ``times``: how many answers each group read fills.
        self.same: list[tuple[int, int]] = []
        self.times: dict[int, int] = {}
        every: dict[str, int] = {}
        for i, g in enumerate(body.groups):
            offer_gil(i + 1)  # on the bulk thread for a large request
            if g.topics is None:
                first = every.get(g.group_id)
                if first is not None:
                    self.same.append((i, first))
                    self.times[first] = self.times.get(first, 1) + 1
                    continue
                every[g.group_id] = i
            shard = runtime.partition_of(g.group_id)
            self.by_shard.setdefault(shard, []).append((i, g.group_id, g.topics))
        self.results: list[tuple[ErrorCode, TopicOffsets | OffsetsCopy]] = [(_ERR_NONE, [])] * len(self.ids)
        self.answered = 0  # offsets the answer holds so far (past LARGE_FETCH it is built off the loop)

    def fail(self, indexes: list[int]) -> Any:
        def fail(error: ErrorCode) -> None:
            for i in indexes:
                self.results[i] = (error, [])

        return fail

    def response(self) -> FetchAnswer:
        """Built once the reply is final, where it is encoded (the bulk thread for a large request); what
        the request held for it is then freed there, a slice at a time: freed with the request on the
        event loop, the groups asked for, their results and buckets (~500k objects for 100k groups)
        held the loop for 56-152 ms. Nothing reads them after: a wait ending in an error comes before.
        So it is called once (a second call would answer no groups), and it empties the request's own
        ``body.groups``."""
        for i, first in self.same:
            self.results[i] = self.results[first]
        answer = _built((gid, error, offsets) for gid, (error, offsets) in zip(self.ids, self.results, strict=True))
        if len(self.ids) > YIELD_EVERY:
            _free(self.results, self.ids, self.asked, *self.by_shard.values())
        return answer


# Up to this many groups a v8+ request is answered group by group, as cheaply as a v7 one; beyond it
# the groups are bucketed by shard so that each shard is read once (and, when large, one per loop pass).
_DIRECT_GROUPS: Final = 16


def prepare(runtime: Runtime, body: FetchRequest, version: int) -> Any:
    return _Groups(runtime, body) if version >= 8 and len(body.groups) > _DIRECT_GROUPS else body


def _fetch_many(data: Any, groups: list[tuple[int, str, Requested]],
                stable: bool) -> list[TopicOffsets | OffsetsCopy]:
    return [read_offsets(data, group_id, requested, stable) for _, group_id, requested in groups]


def outcome(answer: FetchAnswer) -> tuple[int, int]:
    """(first error, partitions fetched without error under a group without one)."""
    first, ok, seen = 0, 0, 0
    for _, error, offsets in answer.groups:
        seen += 1
        offer_gil(seen)  # on the bulk thread for a large request: per group (100k of them) and entry
        if error:
            first = first or error
            continue
        for _, parts in offsets:
            for _, _, e in parts:
                seen += 1
                offer_gil(seen)
                if e:
                    first = first or e
                else:
                    ok += 1
    return first, ok


@handles(SPEC, error_response=error_response, prepare=prepare, outcome=outcome, encode=encode, decode=decode)
def offset_fetch(runtime: Runtime, req: Request, prepared: Any) -> Any:
    if isinstance(prepared, _Groups):
        return _fetch_groups(runtime, req, prepared, req.body.require_stable)
    body: FetchRequest = prepared
    if body.version >= 8:
        return _fetch_few_groups(runtime, req, body, body.require_stable)
    offsets = _read(runtime.shard_for(body.group_id), req, None, body.group_id, body.topics, body.require_stable)
    return _answer(req, [[body.group_id, _ERR_NONE, offsets]])


def _read(shard: Shard, req: Request, fixup: Fixup | None, group_id: str, topics: Requested,
          stable: bool) -> TopicOffsets | OffsetsCopy:
    """``shard.read(req, fixup, read_offsets, ...)`` with ``read_offsets`` called directly."""
    shard.readable()
    offsets = read_offsets(shard.data, group_id, topics, stable)
    shard.read_done(req, fixup)
    return offsets


def _fetch_few_groups(runtime: Runtime, req: Request, body: FetchRequest, stable: bool) -> Any:
    """The common case (a consumer asks for its own group): each group read directly into its part."""
    groups: list[list[Any]] = []
    for g in body.groups:
        entry: list[Any] = [g.group_id, _ERR_NONE, []]
        groups.append(entry)
        try:
            entry[2] = _read(runtime.shard_for(g.group_id), req, _failer(entry), g.group_id, g.topics, stable)
        except ShardUnavailable as exc:
            entry[1] = exc.error
    return _answer(req, groups)


def _answer(req: Request, groups: list[list[Any]]) -> Any:
    """The answer, or when a group's offsets came as a copy (a large fetch: coordinator.offsets), a
    response built from it with the reply, off the event loop (the request becomes a large one)."""
    answered = 0
    for entry in groups:
        if type(entry[2]) is OffsetsCopy:
            req.large = True
            return Lazy(_built, groups)
        answered += _count(entry[2])
    if answered > LARGE_FETCH:
        req.large = True  # encoded off the event loop, as a v8+ answer of many groups is (a review's find)
    return FetchAnswer(groups)


def _count(offsets: TopicOffsets) -> int:
    """The partitions a group's part of the answer holds (past LARGE_FETCH in all: built off the loop)."""
    return sum(len(parts) for _, parts in offsets)


def _built(groups: Iterable[Any]) -> FetchAnswer:
    """The answer from ``(group_id, error, offsets or a copy of them)`` per group; with a copy (on the
    bulk thread) each is turned into its offsets (a failed barrier may have replaced a group's copy with
    its error and no offsets meanwhile). New lists, not the request's: the large answer is then freed
    where it is encoded (``_drain``), not on the event loop with the request (~20 ms for 150k, ~30 ms
    for 100k groups)."""
    answer: list[list[Any]] = []
    copied: list[int] = []
    for i, (gid, error, offsets) in enumerate(groups):
        if type(offsets) is OffsetsCopy:
            offsets = copied_offsets(offsets)
            copied.append(i)
        answer.append([gid, error, offsets])
        offer_gil(i + 1)  # on the bulk thread for a large request (100k groups)
    return BuiltAnswer(answer, copied) if copied or len(answer) > YIELD_EVERY else FetchAnswer(answer)


def _failer(entry: list[Any]) -> Any:
    def fail(error: ErrorCode) -> None:
        entry[1], entry[2] = error, []

    return fail


def _fetch_groups(runtime: Runtime, req: Request, groups: _Groups, stable: bool) -> Any:
    """One read per shard for all its groups (a request may name 100k groups); for a large request one
    shard per event-loop pass, so other clients are served in between."""
    shards = list(groups.by_shard.items())
    if not req.large:
        for partition, members in shards:
            _read_shard(runtime, req, groups, partition, members, stable)
        return Lazy(groups.response)
    req.wait()  # until the last shard has been read
    if shards:
        asyncio.get_running_loop().call_soon(_ShardReads(runtime, req, groups, shards, stable).step, 0)
    else:
        req.done()
    return Lazy(groups.response)


class _ShardReads:
    """A large request's shard reads, one per event-loop pass. A method, not a closure that schedules
    itself: such a closure is a reference cycle, and the whole request (100k groups, ~400k objects)
    would then wait for a collection to be freed (1.3 s on the loop, found with the collector paused)."""

    def __init__(self, runtime: Runtime, req: Request, groups: _Groups,
                 shards: list[tuple[int, list[tuple[int, str, Requested]]]], stable: bool) -> None:
        self.runtime, self.req, self.groups, self.shards, self.stable = runtime, req, groups, shards, stable

    def step(self, i: int) -> None:
        """Reads shard ``i`` and schedules the next. A read that fails unexpectedly (a bug) costs its own
        groups an UNKNOWN_SERVER_ERROR, as Kafka answers a handler's unexpected exception, and not the
        request its answer: nothing would end its wait, or the collector's pause it holds."""
        partition, members = self.shards[i]
        try:
            _read_shard(self.runtime, self.req, self.groups, partition, members, self.stable)
        except Exception:
            log.exception("OffsetFetch: reading %d groups of offsets partition %d failed", len(members), partition)
            self.groups.fail([j for j, _, _ in members])(_ERR_UNKNOWN_SERVER_ERROR)
        if i + 1 < len(self.shards):
            asyncio.get_running_loop().call_soon(self.step, i + 1)
        else:
            self.req.done()


def _read_shard(runtime: Runtime, req: Request, groups: _Groups, partition: int,
                members: list[tuple[int, str, Requested]], stable: bool) -> None:
    indexes = [i for i, _, _ in members]
    try:
        fetched = runtime.shard_at(partition).read(req, groups.fail(indexes), _fetch_many, members, stable)
    except ShardUnavailable as exc:
        groups.fail(indexes)(exc.error)
        return
    for i, offsets in zip(indexes, fetched, strict=True):
        groups.results[i] = (_ERR_NONE, offsets)
        if type(offsets) is OffsetsCopy:
            req.large = True  # the answer is built from the copy where it is encoded, off the event loop
        else:
            groups.answered += groups.times.get(i, 1) * _count(offsets)
    if groups.answered > LARGE_FETCH:
        req.large = True  # many groups' small parts: encoded off the event loop too
