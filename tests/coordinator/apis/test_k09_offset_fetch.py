"""OffsetFetch's handler module (coordinator/apis/k09_offset_fetch.py) beyond what the integration tests
show: a large v8+ request's groups are bucketed, and its answer assembled, on the bulk thread."""

import asyncio
import time
from pathlib import Path

import pytest
from kafka.protocol.consumer.group import OffsetFetchResponse

from coordinator.apis import APIS
from coordinator.apis import k09_offset_fetch as k09
from coordinator.offsets import LARGE_FETCH
from coordinator.request import Request
from coordinator.request import encode_reply as _encode
from protocol.errors import ErrorCode
from protocol.hotcodec import YIELD_EVERY
from protocol.offsetfetch import from_message
from protocol.records import OffsetAndMetadata, OffsetCommitRecord, OffsetKey
from tests.coordinator.harness import Faults, Holds, append, commit, config, started, stop


async def test_many_groups_let_other_threads_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiled code holds the GIL until it returns: bucketing and answering offer it every YIELD_EVERY
    groups, so the event loop is not kept waiting by a request for 100k groups."""
    runtime = await started(config(tmp_path, partitions=4))
    try:
        cls = k09.SPEC.request.cls
        body = from_message(8, cls(groups=[cls.OffsetFetchRequestGroup(group_id=f"g{i}", topics=None)
                                           for i in range(2 * YIELD_EVERY + 1)]))
        offered: list[float] = []
        monkeypatch.setattr(time, "sleep", offered.append)
        groups = k09.prepare(runtime, body, 8)
        assert isinstance(groups, k09._Groups) and offered == [0, 0]
        assert sum(len(members) for members in groups.by_shard.values()) == len(body.groups)
        asked = [g.group_id for g in body.groups]
        answer = groups.response()
        assert [g[0] for g in answer.groups] == asked
        # bucketed (2 offers) and built (2), then what the request held for it freed: results, ids, the
        # groups asked for and their buckets, 4 x 8,193 items (8)
        assert offered == [0] * 12
        assert not body.groups and not groups.results and not groups.ids
        assert not any(groups.by_shard.values())
    finally:
        monkeypatch.undo()
        await stop(runtime)


class _Released(Holds):
    """A connection stand-in that hands back the released request itself."""

    def __init__(self) -> None:
        self.future: asyncio.Future[Request] = asyncio.get_running_loop().create_future()

    def reply_ready(self, request: Request) -> None:
        self.future.set_result(request)


@pytest.mark.parametrize(("version", "fillers"), [(6, 0), (8, 0), (8, 20)], ids=["v6", "v8", "v8-22-groups"])
@pytest.mark.parametrize("sync_fails", [False, True], ids=["durable", "barrier-fails"])
async def test_a_fetch_of_all_of_a_large_group_is_answered_off_the_loop(tmp_path: Path, version: int, fillers: int,
                                                                         sync_fails: bool) -> None:
    """Null topics for a group of more than LARGE_FETCH offsets: the handler reads a copy, the request
    turns large (its reply is built and encoded on the bulk thread), the answer is the group's offsets
    as they were when read, and a read barrier that fails turns it into the error as before. Encoding
    twice gives the same bytes (what the answer frees after encoding is its own, not the request's)."""
    faults = Faults()
    runtime = await started(config(tmp_path, partitions=1), log_factory=faults.factory)
    try:
        shard = runtime.shard_for("big")
        for p in range(LARGE_FETCH + 10):
            shard.data.replay(p, OffsetCommitRecord(OffsetKey("big", "t", p), OffsetAndMetadata(p, -1, "", 1)))
        shard.data.replay(LARGE_FETCH + 10, OffsetCommitRecord(OffsetKey("small", "u", 0),
                                                               OffsetAndMetadata(5, -1, "", 1)))
        faults.fail_next_sync = sync_fails
        written = append(shard, [commit("other", 0, 1)])  # the fetch waits for this write
        cls = k09.SPEC.request.cls
        if version >= 8:
            names = ["big", "small", *(f"filler-{i}" for i in range(fillers))]  # > 16: bucketed by shard
            body = from_message(version, cls(groups=[cls.OffsetFetchRequestGroup(group_id=g, topics=None)
                                                     for g in names], require_stable=False))
        else:
            body = from_message(version, cls(group_id="big", topics=None, require_stable=False))
        sink = _Released()
        req = Request(sink, APIS[9], version, 3)
        req.body = body
        req.wait()  # as the server does around a handler
        req.response = APIS[9].handle(runtime, req, APIS[9].prepare(runtime, body, version) if APIS[9].prepare
                                      else body)
        req.done()
        # a commit after the read is not in the answer
        later = OffsetCommitRecord(OffsetKey("big", "t", 0), OffsetAndMetadata(99, -1, "", 1))
        shard.data.replay(LARGE_FETCH + 11, later)
        released = await asyncio.wait_for(sink.future, 10)
        await written
        assert released.large
        loop = asyncio.get_running_loop()
        data = await loop.run_in_executor(None, _encode, released)
        assert await loop.run_in_executor(None, _encode, released) == data
        resp = OffsetFetchResponse.decode(data[8 + (version >= 6):], version=version)
        groups = [(g.group_id, g.error_code, g.topics) for g in resp.groups] if version >= 8 else \
            [("big", resp.error_code, resp.topics)]
        big = [(t.name, [(p.partition_index, p.committed_offset) for p in t.partitions]) for t in groups[0][2]]
        if sync_fails:
            assert [(gid, error, topics) for gid, error, topics in groups] == \
                [(gid, ErrorCode.NOT_COORDINATOR, []) for gid, _, _ in groups]
        else:
            assert groups[0][1] == 0 and big == [("t", [(p, p) for p in range(LARGE_FETCH + 10)])]
            if version >= 8:
                assert [(t.name, [p.committed_offset for p in t.partitions]) for t in groups[1][2]] == [("u", [5])]
    finally:
        await stop(runtime)


@pytest.mark.parametrize("sync_fails", [False, True], ids=["durable", "barrier-fails"])
async def test_a_group_named_again_and_again_is_read_once_and_answered_off_the_loop(tmp_path: Path,
                                                                                   sync_fails: bool) -> None:
    """A fuzzing campaign's find: a 16 KiB v8 request naming a 2,000-offset group 4,000 times (4 bytes a
    name) read it 4,000 times and built and encoded the 153 MiB answer on the event loop (4.3 s others
    waited). Now it is read once, every naming answered with that part, and an answer holding more than
    LARGE_FETCH offsets in all is built and encoded off the loop, as a large group's is."""
    faults = Faults()
    runtime = await started(config(tmp_path, partitions=2), log_factory=faults.factory)
    try:
        shard = runtime.shard_for("g")
        for p in range(100):
            shard.data.replay(p, OffsetCommitRecord(OffsetKey("g", "t", p), OffsetAndMetadata(p, -1, "", 1)))
        faults.fail_next_sync = sync_fails
        written = append(runtime.shard_for("other"), [commit("other", 0, 1)])  # a read barrier to wait on
        cls = k09.SPEC.request.cls
        t0 = cls.OffsetFetchRequestGroup.OffsetFetchRequestTopics(name="t", partition_indexes=[0])
        names = [cls.OffsetFetchRequestGroup(group_id="g", topics=None) for _ in range(LARGE_FETCH // 100 + 5)]
        names.insert(3, cls.OffsetFetchRequestGroup(group_id="g", topics=[t0]))  # named partitions: read itself
        body = from_message(8, cls(groups=names, require_stable=False))
        prepared = APIS[9].prepare(runtime, body, 8) if APIS[9].prepare else body
        assert isinstance(prepared, k09._Groups)
        assert sum(len(m) for m in prepared.by_shard.values()) == 2  # once for all offsets, once for t-0
        sink = _Released()
        req = Request(sink, APIS[9], 8, 3)
        req.body = body
        req.wait()
        req.response = APIS[9].handle(runtime, req, prepared)
        req.done()
        released = await asyncio.wait_for(sink.future, 10)
        await written
        assert released.large
        data = await asyncio.get_running_loop().run_in_executor(None, _encode, released)
        resp = OffsetFetchResponse.decode(data[9:], version=8)
        every = [("t", [(p, p) for p in range(100)])]
        got = [(g.error_code, [(t.name, [(p.partition_index, p.committed_offset) for p in t.partitions])
                               for t in g.topics]) for g in resp.groups]
        assert len(got) == len(names)
        if shard is runtime.shard_for("other") and sync_fails:  # the barrier this read waited on failed
            assert {error for error, _ in got} == {ErrorCode.NOT_COORDINATOR}
        else:
            assert got == [(0, [("t", [(0, 0)])]) if i == 3 else (0, every) for i in range(len(names))]
    finally:
        await stop(runtime)



@pytest.mark.parametrize("version", [7, 8])
async def test_an_answer_of_many_offsets_from_few_groups_is_encoded_off_the_loop(tmp_path: Path, version: int) -> None:
    """A review's find: the bound of LARGE_FETCH offsets in all held for v8+ requests of more than 16
    groups only; 16 namings of a 4,096-offset group (65,536 offsets) were encoded on the event loop."""
    runtime = await started(config(tmp_path, partitions=1))
    try:
        shard = runtime.shard_for("g")
        for p in range(LARGE_FETCH):  # not more: one naming alone is read directly, not from a copy
            shard.data.replay(p, OffsetCommitRecord(OffsetKey("g", "t", p), OffsetAndMetadata(p, -1, "", 1)))
        cls = k09.SPEC.request.cls
        if version >= 8:
            body = from_message(version, cls(groups=[cls.OffsetFetchRequestGroup(group_id="g", topics=None)
                                                     for _ in range(2)], require_stable=False))
        else:
            body = from_message(version, cls(group_id="g", topics=None, require_stable=False))
        small = from_message(version, cls(groups=[cls.OffsetFetchRequestGroup(group_id="g", topics=[
            cls.OffsetFetchRequestGroup.OffsetFetchRequestTopics(name="t", partition_indexes=[0])])],
            require_stable=False) if version >= 8 else cls(group_id="g", topics=[
                cls.OffsetFetchRequestTopic(name="t", partition_indexes=[0])], require_stable=False))
        for asked, large in ((body, version >= 8), (small, False)):
            sink = _Released()
            req = Request(sink, APIS[9], version, 3)
            req.body = asked
            req.wait()
            req.response = APIS[9].handle(runtime, req, APIS[9].prepare(runtime, asked, version)
                                          if APIS[9].prepare else asked)
            req.done()
            assert (await asyncio.wait_for(sink.future, 10)).large is large
    finally:
        await stop(runtime)
