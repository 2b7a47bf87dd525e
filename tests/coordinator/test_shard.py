"""The shard runtime over real files: durability before acknowledgement, group commit, fail-stop,
and the property that live state equals state reloaded from the log."""

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import coordinator.shard
from coordinator.config import Config
from coordinator.runtime import Runtime
from coordinator.shard import ShardFailed, ShardState, SwapFailed
from coordinator.state import ShardData
from protocol.records import (
    GroupMetadata,
    GroupMetadataRecord,
    OffsetAndMetadata,
    OffsetCommitRecord,
    OffsetKey,
    Record,
)
from storage.log import PartitionLog, list_segments


def config(data_dir: Path, partitions: int = 1, **kw: Any) -> Config:
    return Config(data_dir=data_dir, offsets_partitions=partitions, **kw)


async def started(cfg: Config) -> Runtime:
    runtime = Runtime(cfg)
    runtime.start()
    await runtime.wait_loaded()
    return runtime


def commit(group: str, partition: int, offset: int) -> OffsetCommitRecord:
    return OffsetCommitRecord(OffsetKey(group, "t", partition), OffsetAndMetadata(offset, -1, "m", 1))


def snapshot(data: ShardData) -> tuple[Any, ...]:
    groups = {g: (x.state, x.generation, x.protocol_type, tuple(x.members)) for g, x in data.groups.items()}
    return data.offsets, groups, data.num_offsets


async def test_acknowledged_only_after_the_records_are_on_disk(tmp_path: Path) -> None:
    runtime = await started(config(tmp_path))
    shard = runtime.shards[0]
    durable = shard.append([commit("g", 0, 5), commit("g", 1, 6)])
    assert shard.data.committed("g", "t", 0) is not None  # replayed at once, visible to the next op
    assert shard.barrier() is durable
    await durable
    on_disk = [r.offset for b in PartitionLog(shard.log.directory).recover() for r in b.records]
    assert on_disk == [0, 1]
    await runtime.stop()


async def test_concurrent_commits_share_batches(tmp_path: Path) -> None:
    runtime = await started(config(tmp_path))
    shard = runtime.shards[0]
    futures = [shard.append([commit("g", i, i)]) for i in range(200)]
    await asyncio.gather(*futures)
    assert runtime.metrics.counters["batch_records"] == 200
    assert runtime.metrics.counters["batches"] <= 2
    await runtime.stop()


async def test_fsync_failure_fails_parked_requests_and_reloads(tmp_path: Path) -> None:
    runtime = await started(config(tmp_path))
    shard = runtime.shards[0]
    await shard.append([commit("g", 0, 1)])
    real_sync = shard.log.sync
    calls = 0

    def failing_sync() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError(5, "injected EIO")
        real_sync()

    shard.log.sync = failing_sync  # type: ignore[method-assign]
    lost = shard.append([commit("g", 0, 2)])
    try:
        await lost
        raise AssertionError("a write whose fsync failed was acknowledged")
    except ShardFailed:
        pass
    assert shard.state in (ShardState.FAILED, ShardState.LOADING)
    for _ in range(200):
        if shard.state is ShardState.ACTIVE:
            break
        await asyncio.sleep(0.01)
    assert shard.state is ShardState.ACTIVE
    assert shard.data.committed("g", "t", 0) == OffsetAndMetadata(1, -1, "m", 1)  # the unsynced write is gone
    assert list(shard.log.directory.glob("*.tr"))  # its bytes were kept aside
    await shard.append([commit("g", 0, 3)])
    await runtime.stop()
    reloaded = await started(config(tmp_path))
    assert reloaded.shards[0].data.committed("g", "t", 0) == OffsetAndMetadata(3, -1, "m", 1)
    await reloaded.stop()


async def test_corrupt_partition_fails_while_others_serve(tmp_path: Path) -> None:
    runtime = await started(config(tmp_path, partitions=3))
    for shard in runtime.shards:
        await shard.append([commit("g", i, i) for i in range(5)])
    await runtime.stop()
    seg = list_segments(tmp_path / "__consumer_offsets-1")[0].path
    data = bytearray(seg.read_bytes())
    data[70] ^= 0xFF
    seg.write_bytes(bytes(data))
    runtime = await started(config(tmp_path, partitions=3))
    assert [s.state for s in runtime.shards] == [ShardState.ACTIVE, ShardState.FAILED, ShardState.ACTIVE]
    assert runtime.shards[1].error is not None
    await runtime.stop()


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
        records = [to_record(*op) for op in ops]
        futures = [shard.append(records[i : i + batch_size]) for i in range(0, len(records), batch_size)]
        await asyncio.gather(*futures)
        live = snapshot(shard.data)
        await runtime.stop()
        reloaded = await started(cfg)
        assert snapshot(reloaded.shards[0].data) == live
        await reloaded.stop()

    asyncio.run(scenario())


async def test_compaction_shrinks_the_log_and_keeps_the_state(tmp_path: Path) -> None:
    cfg = config(tmp_path, segment_bytes=2048)
    runtime = await started(cfg)
    shard = runtime.shards[0]
    for round_ in range(60):
        await shard.append([commit("g", p, round_ * 10 + p) for p in range(4)])
    await shard.append([OffsetCommitRecord(OffsetKey("g", "t", 3), None)])
    before = snapshot(shard.data)
    size_before = shard.log.size_bytes
    stats = await shard.compact(delete_retention_ms=60_000)
    assert stats is not None and stats.records_dropped > 0
    assert shard.log.size_bytes < size_before / 2
    assert snapshot(shard.data) == before
    await shard.append([commit("g", 0, 10_000)])  # writes go on after a compaction
    live = snapshot(shard.data)
    await runtime.stop()
    reloaded = await started(cfg)
    assert snapshot(reloaded.shards[0].data) == live
    await reloaded.stop()


async def test_two_failures_in_a_row_start_one_reload_and_lose_nothing(tmp_path: Path) -> None:
    """A compaction I/O error and then a failing write queued behind it on the same writer thread:
    the second failure must not start a second reload that truncates the log being recovered."""
    runtime = await started(config(tmp_path, segment_bytes=4096))
    shard = runtime.shards[0]
    for i in range(200):
        await shard.append([commit(f"g{i}", 0, i)])

    def failing_compaction(now: int, retention: int) -> None:
        time.sleep(0.2)
        raise SwapFailed("injected EIO while swapping a compacted segment")

    shard._compact_if_due = failing_compaction  # type: ignore[method-assign,assignment]
    compaction = asyncio.create_task(shard.compact(0))
    await asyncio.sleep(0.05)

    def failing_append(batch: bytes, last_offset: int) -> None:
        raise OSError(5, "injected EIO in append")

    shard.log.append = failing_append  # type: ignore[method-assign]
    late = shard.append([commit("late", 0, 1)])
    await compaction
    try:
        await late
        raise AssertionError("a failed write was acknowledged")
    except ShardFailed:
        pass
    for _ in range(500):
        if shard.state is ShardState.ACTIVE and shard._reload is not None and shard._reload.done():
            break
        await asyncio.sleep(0.01)
    assert shard.state is ShardState.ACTIVE
    assert shard.data.num_offsets == 200
    await runtime.stop()
    reloaded = await started(config(tmp_path, segment_bytes=4096))
    assert reloaded.shards[0].data.num_offsets == 200
    await reloaded.stop()


async def compaction_held_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Runtime, "asyncio.Task[Any]", threading.Event]:
    """A shard with plenty to compact, and a compaction whose rewrite waits until the event is set."""
    runtime = await started(config(tmp_path, segment_bytes=2048))
    shard = runtime.shards[0]
    for round_ in range(40):
        await shard.append([commit("g", p, round_ * 10 + p) for p in range(4)])
    release = threading.Event()
    real_clean = coordinator.shard.clean

    def slow_clean(*args: Any) -> Any:
        assert release.wait(10)
        return real_clean(*args)

    monkeypatch.setattr(coordinator.shard, "clean", slow_clean)
    compaction = asyncio.create_task(shard.compact(60_000))
    await asyncio.sleep(0.05)
    return runtime, compaction, release


async def test_commits_are_acknowledged_while_a_compaction_rewrite_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime, compaction, release = await compaction_held_open(tmp_path, monkeypatch)
    shard = runtime.shards[0]
    await asyncio.wait_for(shard.append([commit("g", 0, 999)]), 5)  # not held up by the rewrite
    assert not compaction.done()
    release.set()
    stats = await compaction
    assert stats is not None and stats.records_dropped > 0
    live = snapshot(shard.data)
    await runtime.stop()
    reloaded = await started(config(tmp_path, segment_bytes=2048))
    assert snapshot(reloaded.shards[0].data) == live
    await reloaded.stop()


async def test_a_swap_is_refused_after_the_shard_reloaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime, compaction, release = await compaction_held_open(tmp_path, monkeypatch)
    shard = runtime.shards[0]
    before = snapshot(shard.data)
    shard._fail(OSError(5, "injected"), None)  # a write failure: the shard reopens and reloads its log
    for _ in range(500):
        if shard.state is ShardState.ACTIVE:
            break
        await asyncio.sleep(0.01)
    release.set()
    assert await compaction is None  # its swap would have replaced files under the new log object
    assert snapshot(shard.data) == before
    assert not list(shard.log.directory.glob("*.cleaned"))
    await runtime.stop()
    reloaded = await started(config(tmp_path, segment_bytes=2048))
    assert snapshot(reloaded.shards[0].data) == before
    await reloaded.stop()
