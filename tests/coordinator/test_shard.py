"""The shard runtime over real files: durability before acknowledgement, group commit, failures in a
shared flush cycle, huge writes, compaction alongside commits, and the property that live state
equals state reloaded from the log. Its lifecycle (fail-stop, full disk, corruption): test_shardlifecycle.py."""

import asyncio
import errno
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import coordinator.compaction
import coordinator.shard
import storage.cleaner
from coordinator.request import Request, ShardUnavailable
from coordinator.runtime import Runtime
from coordinator.shardstate import ShardState
from coordinator.state import ShardData
from protocol.errors import ErrorCode
from protocol.records import (
    GroupMetadata,
    GroupMetadataRecord,
    LiveRecord,
    OffsetAndMetadata,
    OffsetCommitRecord,
    OffsetKey,
    Record,
)
from storage.log import PartitionLog
from storage.segments import list_segments
from tests.coordinator.harness import (
    OK,
    Faults,
    FutureSink,
    append,
    commit,
    config,
    offsets_of,
    on_disk,
    started,
    stop,
    wait_state,
)

# every test loads both ways: compiled loadcodec and pure Python (tests/coordinator/conftest.py)
pytestmark = pytest.mark.usefixtures("both_loader_paths")


def snapshot(data: ShardData) -> tuple[Any, ...]:
    groups = {g: (x.state, x.generation, x.protocol_type, tuple(x.members)) for g, x in data.groups.items()}
    return offsets_of(data), groups, data.num_offsets


async def test_acknowledged_only_after_the_records_are_on_disk(tmp_path: Path) -> None:
    runtime = await started(config(tmp_path))
    shard = runtime.shards[0]
    durable = append(shard, [commit("g", 0, 5), commit("g", 1, 6)])
    assert shard.data.committed("g", "t", 0) is not None  # replayed at once, visible to the next op
    assert not durable.done()
    assert await durable == OK
    assert on_disk(shard.log.directory) == [0, 1]
    await stop(runtime)


async def test_concurrent_commits_share_batches(tmp_path: Path) -> None:
    runtime = await started(config(tmp_path))
    shard = runtime.shards[0]
    assert await asyncio.gather(*[append(shard, [commit("g", i, i)]) for i in range(200)]) == [OK] * 200
    flushed = runtime.metrics.flush_records
    assert flushed.total == 200  # records
    assert sum(flushed.counts) <= 2  # batches
    await stop(runtime)


class _BrokenSink(FutureSink):
    """A connection whose reply path has a bug."""

    def reply_ready(self, request: Request) -> None:
        raise RuntimeError("a bug in answering one request")


@pytest.mark.parametrize("fails", [False, True], ids=["durable", "sync-fails"])
async def test_a_request_that_cannot_be_answered_leaves_the_rest_of_its_batch_answered(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, fails: bool) -> None:
    """A batch's requests are released in a loop once it is durable (or failed; a rebalance's members
    likewise): a bug in answering one must close that one's connection, not strand those after it."""
    faults = Faults()
    runtime = await started(config(tmp_path), faults.factory)
    shard = runtime.shards[0]
    faults.fail_next_sync = fails
    broken = _BrokenSink()
    append(shard, [commit("g", 0, 1)], broken)  # the batch's first waiter
    others = [append(shard, [commit("g", p, 1)]) for p in range(1, 4)]
    answers = await asyncio.wait_for(asyncio.gather(*others), 10)
    assert answers == [ErrorCode.NOT_COORDINATOR if fails else OK] * 3
    assert broken.aborted == "server_error"
    assert "could not be answered; closing its connection" in caplog.text
    await stop(runtime)


async def test_records_appended_ahead_are_made_durable_by_their_own_cycle(tmp_path: Path) -> None:
    """What the flusher does while the sync helper syncs an earlier cycle (write_ahead), done here
    before the batch's own cycle starts: the cycle appends only what came after, and syncs both."""
    runtime = await started(config(tmp_path))
    shard = runtime.shards[0]
    assert await append(shard, [commit("g", 0, 1)]) == OK
    first = append(shard, [commit("g", 0, 2), commit("g", 1, 2)])
    shard.write_ahead()
    assert shard.written_ahead and on_disk(shard.log.directory) == [0, 1, 2]  # in the file, not yet synced
    assert not first.done()
    second = append(shard, [commit("g", 2, 2)])
    assert await first == OK and await second == OK
    assert on_disk(shard.log.directory) == [0, 1, 2, 3] and shard.log.durable_offset == 4
    assert not shard.written_ahead
    await stop(runtime)
    reloaded = await started(config(tmp_path))
    assert [reloaded.shards[0].data.committed("g", "t", p) for p in range(3)] == [OffsetAndMetadata(2, -1, "m", 1)] * 3
    await stop(reloaded)


async def test_a_batch_appended_ahead_whole_is_only_synced_by_its_cycle(tmp_path: Path) -> None:
    """At a steady, paced load most batches are in the log before their cycle starts: the cycle appends
    nothing more (no record twice) and the requests are answered once the sync is back."""
    runtime = await started(config(tmp_path))
    shard = runtime.shards[0]
    assert await append(shard, [commit("g", 0, 1)]) == OK
    pending = append(shard, [commit("g", 0, 2), commit("g", 1, 2)])
    shard.write_ahead()
    shard.write_ahead()  # nothing new: appends nothing
    assert on_disk(shard.log.directory) == [0, 1, 2]
    assert await pending == OK
    assert on_disk(shard.log.directory) == [0, 1, 2] and shard.log.durable_offset == 3
    await stop(runtime)
    reloaded = await started(config(tmp_path))
    assert [reloaded.shards[0].data.committed("g", "t", p) for p in range(2)] == [OffsetAndMetadata(2, -1, "m", 1)] * 2
    await stop(reloaded)


async def test_an_append_ahead_that_fails_fails_its_batch_in_its_cycle(tmp_path: Path) -> None:
    faults = Faults()
    runtime = await started(config(tmp_path), faults.factory)
    shard = runtime.shards[0]
    assert await append(shard, [commit("g", 0, 1)]) == OK
    waiting = append(shard, [commit("g", 0, 2)])
    faults.fail_next_append = True
    shard.write_ahead()
    assert not shard.written_ahead  # nothing went into the file
    assert await waiting == ErrorCode.NOT_COORDINATOR
    await wait_state(shard, ShardState.ACTIVE)
    assert shard.data.committed("g", "t", 0) == OffsetAndMetadata(1, -1, "m", 1)
    assert await append(shard, [commit("g", 0, 3)]) == OK
    await stop(runtime)


async def test_appending_ahead_never_starts_a_segment(tmp_path: Path) -> None:
    """A new segment's directory entry is not covered by the sync of the one in flight: the batch's
    own cycle starts it (and syncs it through the writer thread)."""
    runtime = await started(config(tmp_path, segment_bytes=300))
    shard = runtime.shards[0]
    assert await append(shard, [commit("g", 0, 1), commit("g", 1, 1)]) == OK
    waiting = append(shard, [commit("g", p, 2) for p in range(3)])
    shard.write_ahead()
    assert not shard.written_ahead and len(shard.log.segments) == 1
    assert await waiting == OK
    assert len(shard.log.segments) == 2 and on_disk(shard.log.directory) == [0, 1, 2, 3, 4]
    await stop(runtime)


OPS = st.lists(
    st.tuples(
        st.sampled_from(["commit", "tombstone", "group", "group-tombstone"]),
        st.sampled_from(["a", "b", "c"]),
        st.integers(0, 3),
        st.integers(0, 1000),
    ),
    max_size=60,
)


def to_record(op: str, group: str, partition: int, offset: int) -> Record:
    if op == "commit":
        return commit(group, partition, offset)
    if op == "tombstone":
        return OffsetCommitRecord(OffsetKey(group, "t", partition), None)
    if op == "group":
        return GroupMetadataRecord(group, GroupMetadata("consumer", offset, None, None, 1))
    return GroupMetadataRecord(group, None)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, batch_size=st.integers(1, 7))
def test_live_state_equals_reloaded_state(tmp_path_factory: Any, ops: list[tuple[str, str, int, int]],
                                          batch_size: int) -> None:
    data_dir = tmp_path_factory.mktemp("prop")

    async def scenario() -> None:
        cfg = config(data_dir, segment_bytes=1024)
        runtime = await started(cfg)
        shard = runtime.shards[0]
        records: list[LiveRecord] = [to_record(*op) for op in ops]
        await asyncio.gather(*[append(shard, records[i : i + batch_size]) for i in range(0, len(records), batch_size)])
        live = snapshot(shard.data)
        await stop(runtime)
        reloaded = await started(cfg)
        assert snapshot(reloaded.shards[0].data) == live
        await stop(reloaded)

    asyncio.run(scenario())


async def test_compaction_shrinks_the_log_and_keeps_the_state(tmp_path: Path) -> None:
    cfg = config(tmp_path, segment_bytes=2048)
    runtime = await started(cfg)
    shard = runtime.shards[0]
    for round_ in range(60):
        await append(shard, [commit("g", p, round_ * 10 + p) for p in range(4)])
    await append(shard, [OffsetCommitRecord(OffsetKey("g", "t", 3), None)])
    before = snapshot(shard.data)
    size_before = shard.log.size_bytes
    stats = await runtime.compactors[0].compact(delete_retention_ms=60_000)
    assert stats is not None and stats.records_dropped > 0
    assert shard.log.size_bytes < size_before / 2
    assert snapshot(shard.data) == before
    assert await append(shard, [commit("g", 0, 10_000)]) == OK  # writes go on after a compaction
    live = snapshot(shard.data)
    await stop(runtime)
    reloaded = await started(cfg)
    assert snapshot(reloaded.shards[0].data) == live
    await stop(reloaded)


async def compaction_held_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Runtime, "asyncio.Task[Any]", threading.Event]:
    """A shard with plenty to compact, and a compaction whose rewrite waits until the event is set."""
    runtime = await started(config(tmp_path, segment_bytes=2048))
    shard = runtime.shards[0]
    for round_ in range(40):
        await append(shard, [commit("g", p, round_ * 10 + p) for p in range(4)])
    release = threading.Event()
    real_clean = storage.cleaner.clean  # what coordinator.compaction imported

    def slow_clean(*args: Any) -> Any:
        assert release.wait(10)
        return real_clean(*args)

    monkeypatch.setattr(coordinator.compaction, "clean", slow_clean)
    compaction = asyncio.create_task(runtime.compactors[0].compact(60_000))
    await asyncio.sleep(0.05)
    return runtime, compaction, release


async def test_commits_are_acknowledged_while_a_compaction_rewrite_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime, compaction, release = await compaction_held_open(tmp_path, monkeypatch)
    shard = runtime.shards[0]
    assert await asyncio.wait_for(append(shard, [commit("g", 0, 999)]), 5) == OK  # not held up by the rewrite
    assert not compaction.done()
    release.set()
    stats = await compaction
    assert stats is not None and stats.records_dropped > 0
    live = snapshot(shard.data)
    await stop(runtime)
    reloaded = await started(config(tmp_path, segment_bytes=2048))
    assert snapshot(reloaded.shards[0].data) == live
    await stop(reloaded)


async def test_a_swap_is_refused_after_the_shard_reloaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime, compaction, release = await compaction_held_open(tmp_path, monkeypatch)
    shard = runtime.shards[0]
    before = snapshot(shard.data)
    shard.fail_write(OSError(5, "injected"))  # a write failure: the shard reopens and reloads its log
    await wait_state(shard, ShardState.ACTIVE)
    release.set()
    assert await compaction is None  # its swap would have replaced files under the new log object
    assert snapshot(shard.data) == before
    assert not list(shard.log.directory.glob("*.cleaned"))
    await stop(runtime)
    reloaded = await started(config(tmp_path, segment_bytes=2048))
    assert snapshot(reloaded.shards[0].data) == before
    await stop(reloaded)


async def test_commits_to_many_partitions_share_flush_cycles(tmp_path: Path) -> None:
    runtime = await started(config(tmp_path, partitions=20))
    shards = runtime.shards
    results = await asyncio.gather(*[append(s, [commit(f"g{i}-{j}", 0, j)]) for j in range(10)
                                     for i, s in enumerate(shards)])
    assert results == [OK] * 200
    cycles = runtime.metrics.sync_partitions  # one observation per sync: how many logs it made durable
    assert cycles.total == sum(runtime.metrics.flush_records.counts)  # every partition batch was in one
    assert sum(cycles.counts) < 200 and cycles.total / sum(cycles.counts) > 1  # several partitions per sync
    for shard in shards:
        assert on_disk(shard.log.directory) == list(range(10))
    await stop(runtime)


async def until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.002)


async def _writer_held(tmp_path: Path) -> tuple[Runtime, Faults, threading.Event, "asyncio.Future[Any]"]:
    """A one-shard runtime whose writer is held (until the event is set, with ``hold_sync`` cleared) in
    the sync of a first commit (the future, pending)."""
    faults = Faults()
    runtime = await started(config(tmp_path, sync_helper=False), faults.factory)  # hold_sync holds the writer
    hold = faults.hold_sync = threading.Event()
    first = append(runtime.shards[0], [commit("g", 0, 1)])
    await until(faults.sync_held.is_set)
    return runtime, faults, hold, first


async def test_a_huge_write_waits_for_the_writer_instead_of_piling_up(tmp_path: Path) -> None:
    """A huge operation replays a slice at a time only as fast as the writer makes them durable, so no
    flush cycle (which every other partition's commits share) takes on the whole of it."""
    runtime, faults, hold, first = await _writer_held(tmp_path)
    shard = runtime.shards[0]
    huge_size = 20 * coordinator.shard.APPEND_SLICE
    huge = append(shard, [commit("h", i, i) for i in range(huge_size)])
    await asyncio.sleep(0.2)  # plenty of loop passes
    assert shard.data.num_offsets < huge_size // 4  # a few slices ahead of the writer, not all of it
    faults.hold_sync = None
    hold.set()
    assert await first == OK
    assert await huge == OK
    assert shard.data.num_offsets == 1 + huge_size
    assert on_disk(shard.log.directory) == list(range(1 + huge_size))
    await stop(runtime)


async def test_a_huge_write_while_the_shard_closes_is_refused_whole(tmp_path: Path) -> None:
    """Refused by its first slice, it was then answered with the handler's own response, as if written
    (an OffsetDelete of that many partitions said deleted; found by a review): it is refused like any
    write the shard cannot take, before anything is replayed."""
    runtime, faults, hold, first = await _writer_held(tmp_path)
    shard = runtime.shards[0]
    closing = asyncio.ensure_future(shard.close(asyncio.get_running_loop().time() + 10))
    await asyncio.sleep(0.05)  # closing: waits for the pending batch, still ACTIVE
    assert shard.state is ShardState.ACTIVE
    with pytest.raises(ShardUnavailable) as refused:
        append(shard, [commit("h", i, i) for i in range(2 * coordinator.shard.APPEND_SLICE)])
    assert refused.value.error == ErrorCode.NOT_COORDINATOR
    assert shard.data.num_offsets == 1
    faults.hold_sync = None
    hold.set()
    assert await first == OK
    assert await closing
    await stop(runtime)


async def test_a_sync_failure_in_a_shared_cycle_fails_only_that_partition(tmp_path: Path) -> None:
    faults = Faults()
    runtime = await started(config(tmp_path, partitions=2), faults.factory)
    first, second = runtime.shards[0], runtime.shards[1]
    written = await asyncio.gather(append(first, [commit("a", 0, 1)]), append(second, [commit("b", 0, 1)]))
    assert list(written) == [OK] * 2
    faults.fail_next_sync = True  # the first log synced in the next cycle fails
    results = await asyncio.gather(append(first, [commit("a", 0, 2)]), append(second, [commit("b", 0, 2)]))
    assert sorted(results, key=str) == sorted([ErrorCode.NOT_COORDINATOR, OK], key=str)
    for shard in (first, second):
        await wait_state(shard, ShardState.ACTIVE)
    # Whatever was acknowledged is there; the failed commit was cut and is not.
    values = {s.partition: s.data.committed(g, "t", 0) for s, g in ((first, "a"), (second, "b"))}
    assert sorted(v.offset for v in values.values() if v is not None) == [1, 2]
    await stop(runtime)


async def test_an_append_failure_in_a_shared_cycle_fails_only_that_partition(tmp_path: Path) -> None:
    faults = Faults()
    runtime = await started(config(tmp_path, partitions=2), faults.factory)
    first, second = runtime.shards[0], runtime.shards[1]
    faults.fail_next_append = True  # the first log appended to in the next cycle fails
    results = await asyncio.gather(append(first, [commit("a", 0, 1)]), append(second, [commit("b", 0, 1)]))
    assert list(results) == [ErrorCode.NOT_COORDINATOR, OK]
    assert on_disk(second.log.directory) == [0]
    await wait_state(first, ShardState.ACTIVE)
    assert first.data.committed("a", "t", 0) is None  # replayed, never durable: reloaded without it
    assert await append(first, [commit("a", 0, 2)]) == OK
    await stop(runtime)


async def test_appended_records_wait_for_their_sync(tmp_path: Path) -> None:
    """The flusher appends on the event loop and syncs on the writer thread: records already in the
    file are not acknowledged, and the next cycle does not start, until that sync is back."""
    faults = Faults()
    runtime = await started(config(tmp_path, partitions=2, sync_helper=False), faults.factory)
    first, second = runtime.shards[0], runtime.shards[1]
    faults.hold_sync = threading.Event()
    held = append(first, [commit("a", 0, 1)])
    await until(faults.sync_held.is_set)
    size = first.log.size_bytes
    assert size > 0  # appended, in the page cache
    later = append(second, [commit("b", 0, 1)])
    await asyncio.sleep(0.1)
    assert not held.done() and not later.done()
    assert second.log.size_bytes == 0  # the next cycle waits for the running sync
    hold, faults.hold_sync = faults.hold_sync, None
    hold.set()
    assert await held == OK
    assert await later == OK
    assert on_disk(first.log.directory) == [0] and on_disk(second.log.directory) == [0]
    await stop(runtime)


async def test_a_failure_while_the_sync_helper_holds_a_cycle_cuts_the_tail_only_after_its_answer(
        tmp_path: Path) -> None:
    """A compaction swap can fail a shard while a cycle still syncs its log through the sync helper,
    whose answer (handled on the loop) marks the log durable up to its size then. The tail is cut,
    and the log reopened, only after that answer: else a claim could name bytes already cut."""
    runtime = await started(config(tmp_path))
    shard = runtime.shards[0]
    helper = runtime.flusher.helper
    assert helper is not None and helper.pid is not None
    assert await append(shard, [commit("g", 0, 1)]) == OK  # the first segment: the writer thread's cycle
    assert await append(shard, [commit("g", 0, 2)]) == OK  # the helper's
    os.kill(helper.pid, signal.SIGSTOP)
    try:
        pending = append(shard, [commit("g", 0, 3)])
        await until(lambda: runtime.flusher.sync_pending_s() > 0)
        old_log = shard.log
        shard.fail_write(OSError(errno.EIO, "a compaction swap failed (injected)"))
        assert await pending == ErrorCode.NOT_COORDINATOR
        await asyncio.sleep(0.2)
        assert shard.log is old_log and shard.state is ShardState.FAILED  # waiting for the helper's answer
    finally:
        os.kill(helper.pid, signal.SIGCONT)
    await wait_state(shard, ShardState.ACTIVE)
    assert shard.log is not old_log
    # Its sync succeeded before the tail was cut, so the refused commit is durable and kept (a client's
    # retry of it is harmless, as with Kafka); nothing past the durable end was.
    committed = shard.data.committed("g", "t", 0)
    assert committed is not None and committed.offset == 3
    assert await append(shard, [commit("g", 0, 4)]) == OK
    await asyncio.sleep(0.3)  # any recording of a claim taken meanwhile lands
    directory = shard.log.directory
    await stop(runtime)
    base, position = PartitionLog(directory).recorded_claim()
    sizes = {seg.base_offset: seg.size for seg in list_segments(directory)}
    assert position <= sizes[base]  # the recovery point names only bytes that are there
    assert on_disk(directory) == [0, 1, 2, 3]
