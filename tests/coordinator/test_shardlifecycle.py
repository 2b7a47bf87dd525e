"""A shard's lifecycle over real files (coordinator.shardlifecycle): fail-stop after a failed write, the
reload that drops the unacknowledged tail, a full or read-only disk served READ_ONLY until it is
writable, corruption that fails one partition, and the guarded transitions."""

import asyncio
import time
from pathlib import Path

import pytest

import coordinator.shardlifecycle
from coordinator.compaction import SwapFailed
from coordinator.request import ShardUnavailable
from coordinator.runtime import Runtime
from coordinator.shard import Shard
from coordinator.shardstate import ShardState
from protocol.errors import ErrorCode
from protocol.records import OffsetAndMetadata
from storage.segments import list_segments
from tests.coordinator.harness import OK, Faults, append, commit, config, on_disk, started, stop, wait_state

# every test loads both ways: compiled loadcodec and pure Python (tests/coordinator/conftest.py)
pytestmark = pytest.mark.usefixtures("both_loader_paths")


async def failed_once(tmp_path: Path, faults: Faults | None = None,
                      switch: str = "fail_next_sync") -> tuple[Runtime, Shard]:
    """A shard that acknowledged one commit (offset 1 of g/t/0), then failed the next one: its fsync, or
    as ``switch`` (a Faults switch, of ``faults``) says."""
    faults = faults or Faults()
    runtime = await started(config(tmp_path), faults.factory)
    shard = runtime.shards[0]
    assert await append(shard, [commit("g", 0, 1)]) == OK
    setattr(faults, switch, True)
    assert await append(shard, [commit("g", 0, 2)]) == ErrorCode.NOT_COORDINATOR
    return runtime, shard


async def test_fsync_failure_fails_waiting_requests_drops_the_tail_and_reloads(tmp_path: Path) -> None:
    runtime, shard = await failed_once(tmp_path)
    await wait_state(shard, ShardState.ACTIVE)
    assert shard.data.committed("g", "t", 0) == OffsetAndMetadata(1, -1, "m", 1)  # the unsynced write is gone
    assert on_disk(shard.log.directory) == [0]  # its bytes were dropped: nobody was told about them
    assert not list(shard.log.directory.glob("*.tr"))
    assert await append(shard, [commit("g", 0, 3)]) == OK
    await stop(runtime)
    reloaded = await started(config(tmp_path))
    assert reloaded.shards[0].data.committed("g", "t", 0) == OffsetAndMetadata(3, -1, "m", 1)
    await stop(reloaded)


async def test_a_full_disk_keeps_acknowledged_offsets_readable_and_recovers_without_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(coordinator.shardlifecycle, "PROBE_INTERVAL_S", 0.05)
    faults = Faults()
    runtime = await started(config(tmp_path), faults.factory)
    shard = runtime.shards[0]
    wakes: list[ShardState] = []  # the cleaner is what gives a full disk room back (coordinator.runtime)
    shard.wake_cleaner = lambda: wakes.append(shard.state)
    assert await asyncio.gather(*[append(shard, [commit("g", i, i)]) for i in range(10)]) == [OK] * 10
    assert wakes == []
    faults.disk_full = True
    assert await append(shard, [commit("g", 0, 100)]) == ErrorCode.NOT_COORDINATOR  # short write + ENOSPC
    await wait_state(shard, ShardState.READ_ONLY)
    assert wakes and ShardState.ACTIVE in wakes  # woken by the failed write
    # Acknowledged offsets stay readable; commits get a retriable error while the disk is full.
    assert shard.read(None, None, lambda data: data.committed("g", "t", 0)) == OffsetAndMetadata(0, -1, "m", 1)
    with pytest.raises(ShardUnavailable) as refused:
        append(shard, [commit("g", 0, 101)])
    assert refused.value.error is ErrorCode.NOT_COORDINATOR
    faults.disk_full = False  # space is freed
    await wait_state(shard, ShardState.ACTIVE)
    wakes.clear()
    assert await append(shard, [commit("g", 0, 102)]) == OK
    assert wakes == [ShardState.ACTIVE]  # and again once writes work: writers would take the freed room
    assert await append(shard, [commit("g", 0, 103)]) == OK
    assert wakes == [ShardState.ACTIVE]  # once
    assert on_disk(shard.log.directory) == list(range(12))  # the partial batch was cut, nothing else
    await stop(runtime)


async def test_a_stop_ends_the_read_only_probe_without_another_probe(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A READ_ONLY partition's probe asleep when kcoord stops: it wakes to the stop, not to a probe (it
    called the writer thread after its sleep regardless, which by then had shut down: a RuntimeError in
    the task at every stop during a full disk; a review's find)."""
    monkeypatch.setattr(coordinator.shardlifecycle, "PROBE_INTERVAL_S", 0.2)
    faults = Faults()
    runtime, shard = await failed_once(tmp_path, faults, "disk_full")
    await wait_state(shard, ShardState.READ_ONLY)
    probing = shard._task
    assert probing is not None and not probing.done()
    await stop(runtime)
    probes = faults.probes
    await asyncio.wait_for(asyncio.shield(probing), 2)  # its sleep over: raised RuntimeError before the fix
    assert probing.exception() is None and faults.probes == probes


async def test_a_tail_that_cannot_be_cut_still_serves_the_durable_part_read_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A short write, then the file system turns read-only (ext4 errors=remount-ro): the unacknowledged
    tail cannot be cut, yet what was acknowledged is served; once writable, the tail is cut first."""
    monkeypatch.setattr(coordinator.shardlifecycle, "PROBE_INTERVAL_S", 0.05)
    faults = Faults()
    runtime = await started(config(tmp_path), faults.factory)
    shard = runtime.shards[0]
    assert await asyncio.gather(*[append(shard, [commit("g", i, i)]) for i in range(5)]) == [OK] * 5
    faults.disk_full = True
    faults.read_only = True
    assert await append(shard, [commit("g", 0, 100)]) == ErrorCode.NOT_COORDINATOR
    await wait_state(shard, ShardState.READ_ONLY)
    assert shard.read(None, None, lambda data: data.committed("g", "t", 0)) == OffsetAndMetadata(0, -1, "m", 1)
    assert shard.read(None, None, lambda data: data.num_offsets) == 5
    faults.disk_full = faults.read_only = False
    await wait_state(shard, ShardState.ACTIVE)
    assert await append(shard, [commit("g", 0, 102)]) == OK
    assert on_disk(shard.log.directory) == list(range(6))  # the half-written batch was cut first
    await stop(runtime)


async def test_repeated_write_failures_are_logged_once_until_a_write_succeeds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A disk that stays nearly full fails a partition's writes again after every reload: one ERROR
    line (then one a minute), not one per failure, for each of 50 partitions; a write that succeeds
    ends the incident, so the next failure is logged at once."""
    faults = Faults()
    runtime = await started(config(tmp_path), faults.factory)
    shard = runtime.shards[0]

    def failures_logged() -> int:
        return sum("write failed" in r.getMessage() for r in caplog.records)

    for _ in range(3):
        faults.fail_next_sync = True
        assert await append(shard, [commit("g", 0, 2)]) == ErrorCode.NOT_COORDINATOR
        await wait_state(shard, ShardState.ACTIVE)
    assert failures_logged() == 1
    assert await append(shard, [commit("g", 0, 3)]) == OK
    faults.fail_next_sync = True
    assert await append(shard, [commit("g", 0, 4)]) == ErrorCode.NOT_COORDINATOR
    assert failures_logged() == 2
    await stop(runtime)


async def test_close_racing_a_reload_ends_closed(tmp_path: Path) -> None:
    runtime, shard = await failed_once(tmp_path)
    await wait_state(shard, ShardState.LOADING, ShardState.FAILED)
    await stop(runtime)
    for _ in range(20):  # whatever the reload was doing, it must not bring the shard back
        await asyncio.sleep(0.01)
        assert shard.state is ShardState.CLOSED


async def test_transitions_are_checked() -> None:
    from coordinator.shardstate import ALLOWED_FROM as _FROM

    assert ShardState.LOADING not in _FROM[ShardState.LOADING]
    assert not any(ShardState.CLOSED in allowed for allowed in _FROM.values())  # CLOSED is final
    assert _FROM[ShardState.ACTIVE] == {ShardState.LOADING, ShardState.READ_ONLY}


async def test_corrupt_partition_fails_while_others_serve(tmp_path: Path) -> None:
    runtime = await started(config(tmp_path, partitions=3))
    for shard in runtime.shards:
        assert await append(shard, [commit("g", i, i) for i in range(5)]) == OK
    await stop(runtime)
    seg = list_segments(tmp_path / "__consumer_offsets-1")[0].path
    data = bytearray(seg.read_bytes())
    data[70] ^= 0xFF
    seg.write_bytes(bytes(data))
    runtime = await started(config(tmp_path, partitions=3))
    assert [s.state for s in runtime.shards] == [ShardState.ACTIVE, ShardState.FAILED, ShardState.ACTIVE]
    assert runtime.shards[1].read_error is ErrorCode.NOT_COORDINATOR
    await stop(runtime)


async def test_two_failures_in_a_row_start_one_reload_and_lose_nothing(tmp_path: Path) -> None:
    """A compaction I/O error and then a failing write queued behind it on the same writer thread:
    the second failure must not start a second reload that truncates the log being recovered."""
    faults = Faults()
    runtime = await started(config(tmp_path, segment_bytes=4096), faults.factory)
    shard = runtime.shards[0]
    for i in range(200):
        await append(shard, [commit(f"g{i}", 0, i)])
    compactor = runtime.compactors[0]

    def failing_compaction(now: int, retention: int) -> None:
        time.sleep(0.2)
        raise SwapFailed("injected EIO while swapping a compacted segment")

    compactor._compact_if_due = failing_compaction  # type: ignore[method-assign,assignment]
    compaction = asyncio.create_task(compactor.compact(0))
    await asyncio.sleep(0.05)
    faults.fail_next_append = True
    late = append(shard, [commit("late", 0, 1)])
    await compaction
    assert await late == ErrorCode.NOT_COORDINATOR
    await wait_state(shard, ShardState.ACTIVE)
    assert shard.data.num_offsets == 200
    await stop(runtime)
    reloaded = await started(config(tmp_path, segment_bytes=4096))
    assert reloaded.shards[0].data.num_offsets == 200
    await stop(reloaded)
