"""Compaction of a shard's log (coordinator.compaction) where the disk is full or the journal keeps
segments for a recovery: real runtimes, real files, faults injected through the log factory."""

import asyncio
import errno
import os
from pathlib import Path
from typing import Any

import pytest

from coordinator.shardstate import ShardState
from coordinator.timers import ManualClock
from protocol.records import OffsetCommitRecord, OffsetKey
from storage.cleaner import CLEANER_OFFSET
from tests.coordinator.harness import OK, Faults, append, commit, config, started, stop, wait_state
from tests.coordinator.test_journal_mode import journal_config
from tests.coordinator.test_journal_mode import started as started_journal


async def _superseded(shard: Any, rounds: int) -> None:
    """The same four offsets committed ``rounds`` times: nearly all of the log is superseded."""
    for r in range(rounds):
        assert await append(shard, [commit("g", p, r * 10 + p) for p in range(4)]) == OK


async def test_a_read_only_partition_whose_swap_fails_reloads_once_the_disk_has_room(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A review's find: a swap failing part-way on a partition read-only for want of room failed it for
    good (no reload started: its task was the probe loop, which then ended), refusing reads too."""
    faults = Faults()
    runtime = await started(config(tmp_path, segment_bytes=2048), faults.factory)
    shard = runtime.shards[0]
    await _superseded(shard, 40)
    faults.disk_full = True
    assert await append(shard, [commit("g", 0, 9999)]) != OK
    await wait_state(shard, ShardState.READ_ONLY)
    assert shard.compactable
    real_replace = os.replace

    def swap_fails(src: Any, dst: Any, *args: Any, **kw: Any) -> None:
        if str(dst).endswith(".swap"):
            raise OSError(errno.ENOSPC, "No space left on device (injected in the swap)")
        real_replace(src, dst, *args, **kw)

    monkeypatch.setattr(os, "replace", swap_fails)  # storage.cleaner's
    assert await runtime.compactors[0].compact(60_000) is None
    monkeypatch.setattr(os, "replace", real_replace)
    assert shard.state is ShardState.READ_ONLY and not shard.compactable  # still serving reads
    assert shard.data.committed("g", "t", 0) is not None
    faults.disk_full = False
    await wait_state(shard, ShardState.ACTIVE)  # the probe finds room: a reload, then writes
    assert await append(shard, [commit("g", 0, 10_000)]) == OK
    await stop(runtime)


async def test_no_log_is_compacted_while_the_journal_keeps_segments_for_a_recovery(tmp_path: Path) -> None:
    """A fault campaign's find: a crash while the journal keeps segments for a partition yet to recover
    (its run not written on a full disk) replays them whole into every log, and a log compacted
    meanwhile then failed its partition at the start ("no segment at or after the recovery point")."""
    runtime = await started_journal(journal_config(tmp_path, partitions=2, segment_bytes=2048))
    shard = runtime.shards[0]
    await _superseded(shard, 40)
    journal, checkpointer = runtime.journal, runtime.checkpointer
    assert journal is not None and checkpointer is not None
    assert await checkpointer.checkpoint()  # the logs synced: compactable from here on
    segments = [seg.path.name for seg in shard.log.segments]
    journal.recovering(1)  # partition 1 recovers (as if its run could not be written yet)
    assert journal.holding
    assert await runtime.compactors[0].compact(60_000) is None
    assert [seg.path.name for seg in shard.log.segments] == segments
    journal.applied(1)
    stats = await runtime.compactors[0].compact(60_000)
    assert stats is not None and stats.records_dropped > 0
    await stop(runtime)


async def test_a_partition_read_only_for_want_of_room_is_compacted_soon(tmp_path: Path) -> None:
    """The cleaner looks a second after a write fails or a partition turns read-only for want of room,
    not only every backoff (an hour here), and compacts it read-only as it is."""
    faults = Faults()
    runtime = await started(config(tmp_path, segment_bytes=2048, log_cleaner_backoff_ms=3_600_000), faults.factory)
    shard = runtime.shards[0]
    await _superseded(shard, 40)
    faults.disk_full = True
    assert await append(shard, [commit("g", 0, 9999)]) != OK
    await wait_state(shard, ShardState.READ_ONLY)
    deadline = asyncio.get_running_loop().time() + 10
    while len(shard.log.segments) > 3:  # compacted, read-only as it is
        assert asyncio.get_running_loop().time() < deadline, [s.path.name for s in shard.log.segments]
        await asyncio.sleep(0.05)
    assert shard.state is ShardState.READ_ONLY
    await stop(runtime)


async def test_an_idle_log_is_not_rewritten_again_until_a_tombstone_passes_its_horizon(tmp_path: Path) -> None:
    """A campaign's find: with a short delete retention every backoff rewrote an idle log to no effect.
    A pass for the delete horizon now waits for new writes or for a kept tombstone's horizon."""
    runtime = await started(config(tmp_path, segment_bytes=2048))
    shard, compactor = runtime.shards[0], runtime.compactors[0]
    await _superseded(shard, 40)
    assert (await compactor.compact(0)) is not None
    assert await compactor.compact(0) is None  # nothing written since, no tombstone kept
    assert await append(shard, [commit("g", 9, 1)]) == OK
    assert await append(shard, [OffsetCommitRecord(OffsetKey("g", "t", 9), None)]) == OK  # the newest for its key
    await _superseded(shard, 20)  # the tombstone's segment closes
    stamped = await compactor.compact(0)  # new writes: a pass, which stamps the kept tombstones' horizon
    assert stamped is not None and stamped.tombstone_horizon_ms is not None
    await asyncio.sleep(0.01)  # past that horizon (now + 0)
    dropped = await compactor.compact(0)
    assert dropped is not None and dropped.records_dropped >= 1 and dropped.tombstone_horizon_ms is None
    assert await compactor.compact(0) is None
    assert shard.data.committed("g", "t", 9) is None and shard.data.committed("g", "t", 0) is not None
    await stop(runtime)


async def _live_and_superseded(shard: Any) -> None:
    """Distinct keys the log keeps across segments, then superseded ones: compaction drops some, keeps most."""
    for p in range(0, 120, 4):
        assert await append(shard, [commit("live", p + i, 1) for i in range(4)]) == OK
    await _superseded(shard, 20)


async def test_a_restart_does_not_compact_again_a_log_compacted_before_it(tmp_path: Path) -> None:
    """Where the last compaction ended outlives the process (Kafka's cleaner-offset-checkpoint): the
    first look after every start compacted each log whole, reading a 166 MB log of live keys for ~4 s
    of CPU beside the event loop to keep every byte."""
    cfg = config(tmp_path, segment_bytes=2048)
    runtime = await started(cfg)
    await _live_and_superseded(runtime.shards[0])
    first = await runtime.compactors[0].compact(60_000)
    assert first is not None and first.records_dropped > 0 and first.bytes_after > 0
    await stop(runtime)
    recorded = tmp_path / "__consumer_offsets-0" / CLEANER_OFFSET
    assert int(recorded.read_text().split()[0]) == first.clean_end_offset

    runtime = await started(cfg)
    assert await runtime.compactors[0].compact(60_000) is None  # nothing new since
    await _live_and_superseded(runtime.shards[0])  # new writes: dirty again
    again = await runtime.compactors[0].compact(60_000)
    assert again is not None and again.records_dropped > 0
    assert int(recorded.read_text().split()[0]) == again.clean_end_offset
    await stop(runtime)


@pytest.mark.parametrize("record", ["", "garbage\n", "-5\n", "999999999\n", "999999999 0 -1 0\n"])
async def test_an_unreadable_or_impossible_clean_end_counts_the_whole_log_dirty(
        tmp_path: Path, record: str, caplog: pytest.LogCaptureFixture) -> None:
    """A record a crash tore, or one past the active segment's start (the log cut or replaced since), is
    not believed: the log is compacted whole, as before there was a record."""
    cfg = config(tmp_path, segment_bytes=2048)
    runtime = await started(cfg)
    await _live_and_superseded(runtime.shards[0])
    assert await runtime.compactors[0].compact(60_000) is not None
    await stop(runtime)
    (tmp_path / "__consumer_offsets-0" / CLEANER_OFFSET).write_text(record)

    runtime = await started(cfg)
    stats = await runtime.compactors[0].compact(60_000)
    assert stats is not None and stats.bytes_before > 0
    assert "the whole log counts as dirty" in caplog.text
    await stop(runtime)


async def test_a_restart_keeps_the_pass_for_tombstones_whose_horizon_passed(tmp_path: Path) -> None:
    """A review's find: with the clean end kept across restarts, the pass for kept tombstones' delete
    horizon waited delete_retention_ms from each start (when the last clean ran, and the horizon its
    tombstones wait for, were not kept): an idle log restarted more often than that kept its expired
    tombstones for good. Before the horizon, a restart still leaves a compacted log alone."""
    hour = 3_600_000
    cfg = config(tmp_path, segment_bytes=2048)
    t0 = 1_700_000_000_000
    runtime = await started(cfg, clock=ManualClock(t0))
    shard = runtime.shards[0]
    await _superseded(shard, 20)
    assert await append(shard, [commit("g", 9, 1)]) == OK
    assert await append(shard, [OffsetCommitRecord(OffsetKey("g", "t", 9), None)]) == OK  # the newest for its key
    await _superseded(shard, 20)
    stamped = await runtime.compactors[0].compact(hour)
    assert stamped is not None and stamped.tombstone_horizon_ms == t0 + hour
    await stop(runtime)

    runtime = await started(cfg, clock=ManualClock(t0 + hour // 2))  # before the horizon: left alone
    assert await runtime.compactors[0].compact(hour) is None
    await stop(runtime)
    runtime = await started(cfg, clock=ManualClock(t0 + 2 * hour))  # past it: the tombstone goes
    dropped = await runtime.compactors[0].compact(hour)
    assert dropped is not None and dropped.records_dropped >= 1 and dropped.tombstone_horizon_ms is None
    assert runtime.shards[0].data.committed("g", "t", 9) is None
    assert await runtime.compactors[0].compact(hour) is None  # and then nothing new
    await stop(runtime)
