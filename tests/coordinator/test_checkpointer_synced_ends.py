"""The checkpointer and the journal's synced-ends entry (storage.journal ``write_synced_ends``): when it
cannot be written, when it has not changed, a failed partition's, and what a checkpoint may delete while
a partition begins to recover. A review of the entry's first version found each of the first four; the
last is older."""

import asyncio
import errno
import os
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest

import storage.journal
from coordinator.runtime import Runtime
from coordinator.shardstate import ShardState
from protocol.records import OffsetAndMetadata
from storage.journalentries import SYNCED_ENDS, read_entries
from storage.journalsync import JournalSync
from tests.coordinator.harness import OK, append, commit, stop
from tests.coordinator.test_journal_mode import journal_config, started

_HEADER = struct.Struct(">iiI")


def fail_synced_ends_writes(monkeypatch: pytest.MonkeyPatch, times: int = 1) -> dict[str, int]:
    """ENOSPC for the next ``times`` writes of a synced-ends entry (a header whose partition field is
    SYNCED_ENDS), as a full disk gives for a fresh journal segment; every other write goes through."""
    real = os.write
    left = {"n": times}

    def write(fd: int, data: Any) -> int:
        raw = bytes(data[:_HEADER.size])
        if left["n"] > 0 and len(raw) == _HEADER.size and _HEADER.unpack(raw)[1] == SYNCED_ENDS:
            left["n"] -= 1
            raise OSError(errno.ENOSPC, "No space left on device (injected: synced-ends entry)")
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)  # storage.journal calls os.write: only its synced-ends entries fail
    return left


def journal_of(runtime: Runtime) -> storage.journal.Journal:
    assert runtime.journal is not None
    return runtime.journal


async def test_a_synced_ends_entry_not_written_leaves_a_start_after_a_crash_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint whose synced-ends write fails (a full disk) does not wait for it: its segments go and
    the logs count as synced as always, so the cleaner compacts there and a start after a crash has
    nothing to replay. Its first version kept every segment yet marked the logs synced, and that start
    replayed them whole into the compacted log, which then FAILED its recovery (a review's find: what
    test_journal_faults #11 guards against); keeping them and the logs unsynced would keep a full disk
    full (the cleaner compacts only what is synced)."""
    data = tmp_path / "d"
    runtime = await started(journal_config(data, segment_bytes=1024))
    shard = runtime.shards[0]
    assert runtime.checkpointer is not None
    offset = 0
    for _ in range(30):  # a few segments of one key
        offset += 1
        assert await append(shard, [commit("g", 0, offset)]) == OK
    assert await runtime.checkpointer.checkpoint()
    synced = shard.log.synced_offset
    for _ in range(40):
        offset += 1
        assert await append(shard, [commit("g", 0, offset)]) == OK
    fail_synced_ends_writes(monkeypatch)
    assert await runtime.checkpointer.checkpoint()  # its syncfs succeeded; its entry was not written
    retained = journal_of(runtime).retained
    advanced = shard.log.synced_offset
    await runtime.compactors[0].compact(0)
    crashed = tmp_path / "crashed"
    shutil.copytree(data, crashed)  # kill -9
    await stop(runtime)
    assert retained == 1 and advanced > synced  # its segments went, the log counts as synced
    for start in range(2):  # the start after the crash, and one after it (what it wrote is read back)
        again = await started(journal_config(crashed, segment_bytes=1024))
        state, got = again.shards[0].state, again.shards[0].data.committed("g", "t", 0)
        await stop(again)
        assert (state, got) == (ShardState.ACTIVE, OffsetAndMetadata(offset, -1, "m", 1)), \
            f"start {start}: log counted synced from {synced} to {advanced} while kept segments replay from {synced}"


async def test_a_failed_synced_ends_write_does_not_leave_an_idle_journal_checkpointing_forever(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The failed write breaks the segment just rotated to, which holds no batch. In the entry's first
    version ``rotate`` only rotated a live segment holding batches, so every later checkpoint found the
    same broken segment, wrote nothing and deleted nothing, and ``retained > 1`` made each interval due
    again: an idle server ran a syncfs every interval and kept its old segments until a commit arrived
    (a review's find). Now the next checkpoint rotates past it and writes the entry, once."""
    runtime = await started(journal_config(tmp_path / "d", checkpoint_interval_ms=50))
    shard = runtime.shards[0]
    checkpointer = runtime.checkpointer
    assert checkpointer is not None
    journal = journal_of(runtime)
    await asyncio.sleep(0.3)  # the periodic checkpoints settle: nothing left to checkpoint
    left = fail_synced_ends_writes(monkeypatch)  # once: the disk has room again right after
    assert await append(shard, [commit("g", 0, 1)]) == OK
    await asyncio.sleep(0.3)  # the next periodic checkpoint meets the failure
    assert left["n"] == 0
    before = checkpointer.completed
    await asyncio.sleep(1.0)  # idle from here on: no commit, the disk writable again
    done, retained, broken = checkpointer.completed - before, journal.retained, journal.live.broken
    entries = [p for p, _, _ in read_entries(journal.live.path)]
    await stop(runtime)
    assert (retained, broken, done) == (1, False, 0), f"{done} checkpoints (each a syncfs) in 1 s of idleness"
    assert entries == [SYNCED_ENDS]  # written again by the checkpoint after the failure


async def test_an_idle_live_segment_does_not_grow_with_every_checkpoint(tmp_path: Path) -> None:
    """While the journal holds (a partition yet to recover: a load retrying an I/O error, a tail that
    cannot be cut), ``retained > 1`` makes every interval a checkpoint, and each appends another
    synced-ends entry to a live segment that is never rotated (it holds no batch) nor counted
    (``live_size`` leaves the entries out): it grows by 12 bytes per partition every interval, for as
    long as the hold lasts (50 partitions at 250 ms: ~200 MB a day), and every start reads it whole."""
    runtime = await started(journal_config(tmp_path / "d", partitions=4))
    assert runtime.checkpointer is not None
    journal = journal_of(runtime)
    for shard in runtime.shards:
        assert await append(shard, [commit("g", shard.partition, 1)]) == OK
    journal.recovering(3)  # partition 3 "yet to recover" (the state a retrying load leaves)
    assert await runtime.checkpointer.checkpoint()
    size = journal.live.size
    for _ in range(20):
        assert await runtime.checkpointer.checkpoint()
    grown = journal.live.size - size
    journal.applied(3)
    await stop(runtime)
    assert grown == 0, f"the idle live segment grew by {grown} bytes in 20 checkpoints"


async def test_a_partition_that_begins_to_recover_during_a_checkpoints_syncfs_keeps_every_segment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a checkpoint deletes is decided on the loop before its syncfs; a partition whose reload
    begins meanwhile may cut its log back for the rewrite of its journal batches, the syncfs put the cut
    on disk without the rewrite, and the deleted segments were what brought the rewrite back after a
    crash (a review's find). Decided again after the syncfs, under the lock the recovery's start takes:
    every segment stays, and no log counts as synced past them."""
    runtime = await started(journal_config(tmp_path / "d", partitions=2))
    checkpointer, journal = runtime.checkpointer, journal_of(runtime)
    assert checkpointer is not None
    shard = runtime.shards[1]
    assert await append(shard, [commit("g", 1, 1)]) == OK
    synced = shard.log.synced_offset
    segments = {seg.seq for seg in journal._segments.values()}
    syncfs = JournalSync.checkpoint_sync

    def reload_begins_meanwhile(self: JournalSync) -> None:
        syncfs(self)
        journal.recovering(1)

    monkeypatch.setattr(JournalSync, "checkpoint_sync", reload_begins_meanwhile)
    assert await checkpointer.checkpoint()
    kept, synced_after = {seg.seq for seg in journal._segments.values()}, shard.log.synced_offset
    monkeypatch.setattr(JournalSync, "checkpoint_sync", syncfs)
    journal.applied(1)
    assert await checkpointer.checkpoint()
    dropped = segments - {seg.seq for seg in journal._segments.values()}
    await stop(runtime)
    assert segments <= kept and synced_after == synced
    assert dropped == segments  # once it has recovered, the next checkpoint deletes them
