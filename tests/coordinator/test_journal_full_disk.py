"""A journal run that cannot be written over its partition's log (a full disk): the partition serves
its log and the rest of the run read-only, and only what a power cut cannot take back and a later
recovery would not contradict; it reloads once the run fits. Tests 2-5 are a review's repros
(2026-11-27): each failed before its fix."""

import asyncio
import errno
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

import coordinator.shard
import coordinator.shardlifecycle
import storage.journalentries
from coordinator.request import ShardUnavailable
from coordinator.shardstate import ShardState
from protocol.errors import ErrorCode
from protocol.records import OffsetAndMetadata
from storage.log import PROBE_BYTES, LogCorruptError, PartitionLog, TailNotCut
from tests.coordinator.harness import OK, Faults, append, commit, stop, wait_state
from tests.coordinator.test_journal_faults import GatedLog, GatedLogFaults, _reload_held_after_its_cut, ckpt
from tests.coordinator.test_journal_mode import committed, committed_at_a_start, journal_config, started
from tests.storage.test_journal import acknowledged, batch, opened, recovered


def _read(shard: coordinator.shard.Shard) -> OffsetAndMetadata | None:
    """Through the shard's read path, as an OffsetFetch is served."""
    got: OffsetAndMetadata | None = shard.read(None, None, lambda d: d.committed("g", "t", 0))
    return got


# 1. availability (a fault campaign's full disk): such a partition stayed FAILED, refusing reads of
# acknowledged offsets too, until space returned
async def test_a_partition_whose_run_cannot_be_written_serves_it_read_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(coordinator.shardlifecycle, "PROBE_INTERVAL_S", 0.05)
    faults = GatedLogFaults()
    data = tmp_path / "d"
    runtime = await started(journal_config(data), faults)
    shard = runtime.shards[0]
    gate = await _reload_held_after_its_cut(shard, faults)
    faults.disk_full = True  # the run's first append writes half its batch, then ENOSPC
    faults.gate = None
    gate.set()
    await wait_state(shard, ShardState.READ_ONLY)
    assert _read(shard) == OffsetAndMetadata(2, -1, "m", 1)  # commit 2 is only in the journal: the log was cut
    with pytest.raises(ShardUnavailable) as refused:
        append(shard, [commit("g", 0, 4)])
    assert refused.value.error is ErrorCode.NOT_COORDINATOR
    crashed = tmp_path / "crashed"
    shutil.copytree(data, crashed)  # kill -9 while read-only
    faults.disk_full = False
    await wait_state(shard, ShardState.ACTIVE)  # the probe succeeds: reloaded, the run written
    assert committed(runtime) == OffsetAndMetadata(2, -1, "m", 1)
    assert await append(shard, [commit("g", 0, 5)]) == OK
    await stop(runtime)
    for directory, offset in ((data, 5), (crashed, 2)):
        assert await committed_at_a_start(journal_config(directory)) == OffsetAndMetadata(offset, -1, "m", 1), directory


# 2. a journal entry an earlier process wrote but never synced (killed in between: never acknowledged)
# was served from the page cache, and a power cut could then take back what clients had read
async def test_the_journal_an_earlier_process_left_is_fsynced_before_it_is_served(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "d"
    faults = Faults()
    runtime = await started(journal_config(data, sync_helper=False), faults)
    shard = runtime.shards[0]
    assert await append(shard, [commit("g", 0, 1)]) == OK
    journal = runtime.journal
    assert journal is not None
    segment = journal.live.path.name
    faults.hold_sync = threading.Event()
    pending = append(shard, [commit("g", 0, 2)])  # journal written, its fdatasync held
    await asyncio.get_running_loop().run_in_executor(None, faults.sync_held.wait, 5)
    crashed = tmp_path / "crashed"
    shutil.copytree(data, crashed)  # kill -9: commit 2 never acknowledged, its entry never synced
    faults.hold_sync.set()
    faults.hold_sync = None
    await pending
    await stop(runtime)

    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: Any) -> None:
        fd = fd if isinstance(fd, int) else fd.fileno()
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    full = Faults()
    full.disk_full = True  # restarted on a full disk
    again = await started(journal_config(crashed), full)
    shard = again.shards[0]
    assert shard.state is ShardState.READ_ONLY
    assert _read(shard) == OffsetAndMetadata(2, -1, "m", 1)
    assert str(crashed / "journal" / segment) in synced  # before it served: a power cut cannot take it back
    assert any(path.startswith(str(crashed / "__consumer_offsets-0")) for path in synced)
    await stop(again)


# 3. with a damaged journal (its run ends early) and no room to keep the log's differing tail aside, the
# partition served offsets older than what its log held and claimed durable; the same recovery with room
# says the log is corrupt. It now serves nothing (the OSError: it retries) rather than contradict that.
def test_a_log_the_recovery_would_find_corrupt_is_not_served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    journal, plog = opened(tmp_path)
    acknowledged(journal, plog, [batch(i) for i in range(5)])
    plog.sync()  # the log on disk, its recovery point past offset 4
    plog.checkpoint()
    seg = journal.live.path
    plog.close()
    journal.close(remove=False)  # killed before a checkpoint deleted the journal segment
    raw = bytearray(seg.read_bytes())  # the entry at offset 2 damaged: the run ends at 1
    raw[2 * (len(raw) // 5) + 40] ^= 0xFF
    seg.write_bytes(bytes(raw))

    def no_room(path: Path, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device (injected)")

    monkeypatch.setattr(storage.journalentries, "write_aside", no_room)  # making room for the run
    journal, plog = opened(tmp_path, recover=False)
    with pytest.raises(OSError) as failed:
        list(plog.recover())
    assert not isinstance(failed.value, TailNotCut) and failed.value.errno == errno.ENOSPC
    plog.close()
    journal.close(remove=False)
    monkeypatch.undo()
    with pytest.raises(LogCorruptError):
        recovered(tmp_path)


class _TightLog(GatedLog):
    """Exactly the probe's 64 KiB free: more fails to be written (the probe's file too), as the run does."""

    loads = 0

    def recover(self, replayable: bool = False) -> Any:
        _TightLog.loads += 1
        return super().recover(replayable)

    def probe(self) -> None:
        if getattr(self.faults, "tight", False):
            assert self.journal is not None
            if max(self.journal.needs_bytes, PROBE_BYTES) > PROBE_BYTES:
                raise OSError(errno.ENOSPC, "No space left on device (injected)")
            PartitionLog.probe(self)
        else:
            super().probe()


class _TightFaults(GatedLogFaults):
    tight = False

    def factory(self, directory: Path, segment_bytes: int) -> Any:
        return _TightLog(directory, segment_bytes, self)


# 4. with less room than the run but more than the probe's 64 KiB, the partition reloaded (the whole log,
# reads refused meanwhile) every probe interval, logging an ERROR each time
async def test_a_run_that_does_not_fit_is_not_reloaded_every_probe_interval(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(coordinator.shardlifecycle, "PROBE_INTERVAL_S", 0.05)
    faults = _TightFaults()
    runtime = await started(journal_config(tmp_path), faults)
    shard = runtime.shards[0]
    assert await append(shard, [commit("bulk", p, 1) for p in range(2000)]) == OK  # a run over 64 KiB
    gate = await _reload_held_after_its_cut(shard, faults)
    faults.tight = True
    faults.disk_full = True
    faults.gate = None
    gate.set()
    await wait_state(shard, ShardState.READ_ONLY)
    _TightLog.loads = 0
    refused = 0
    for _ in range(100):  # 1 s: 20 probe intervals
        await asyncio.sleep(0.01)
        refused += shard.read_error is not None
    errors = sum("cannot be written into the log now" in r.getMessage() for r in caplog.records)
    assert (_TightLog.loads, refused, errors) == (0, 0, 1)
    faults.tight = faults.disk_full = False  # room again: reloaded, the run written
    await wait_state(shard, ShardState.ACTIVE)
    assert committed(runtime) == OffsetAndMetadata(2, -1, "m", 1)
    await stop(runtime)


# 5. data loss (older than serving the run read-only): a failed checkpoint moved where a partition whose
# rewrite had failed reads its journal from, past its run; its reload then read no run and served nothing
async def test_a_failed_checkpoint_while_a_run_is_unwritten_loses_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(coordinator.shardlifecycle, "PROBE_INTERVAL_S", 0.05)
    faults = GatedLogFaults()
    runtime = await started(journal_config(tmp_path), faults)
    shard = runtime.shards[0]
    gate = await _reload_held_after_its_cut(shard, faults)
    faults.disk_full = True
    faults.gate = None
    gate.set()
    await wait_state(shard, ShardState.READ_ONLY)
    assert await ckpt(runtime).checkpoint()  # syncs the cut log; later reads of the journal start after it
    faults.fail_next_checkpoint = True
    assert not await ckpt(runtime).checkpoint()  # writeback ENOSPC on the full disk, say: hold()
    faults.disk_full = False
    await wait_state(shard, ShardState.ACTIVE)
    got = committed(runtime)
    await stop(runtime)
    assert got == OffsetAndMetadata(2, -1, "m", 1)
