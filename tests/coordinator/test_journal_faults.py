"""Journal faults a review of it found (2026-11-27): each test failed before its fix, with an
acknowledged commit lost, a partition wrongly FAILED, a descriptor leaked or a refused commit back."""

import asyncio
import errno
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

import coordinator.checkpointer
import storage.log
from coordinator.checkpointer import Checkpointer
from coordinator.runtime import Runtime
from coordinator.shard import Shard
from coordinator.shardstate import ShardState
from protocol.errors import ErrorCode
from protocol.records import OffsetAndMetadata
from storage.journal import Journal, JournalSegment
from storage.synchelper import SyncHelper
from tests.coordinator.harness import OK, Faults, FaultyJournal, FaultyLog, append, commit, stop, wait_state
from tests.coordinator.test_journal_mode import committed, committed_at_a_start, journal_config, started


class GatedJournal(FaultyJournal):
    """make_spare (checkpoint thread) waits for ``gate`` once armed."""

    gate: threading.Event | None = None
    entered = threading.Event()

    def make_spare(self, seq: int, reuse: Path | None = None) -> JournalSegment:
        if self.gate is not None:
            self.entered.set()
            self.gate.wait(10)
        return super().make_spare(seq, reuse)


class GatedFaults(Faults):
    def journal(self, data_dir: Path) -> Journal:
        self.j = GatedJournal(data_dir, self)
        return self.j


def ckpt(runtime: Runtime) -> Checkpointer:
    assert runtime.checkpointer is not None
    return runtime.checkpointer


def journal_of(runtime: Runtime) -> Journal:
    assert runtime.journal is not None
    return runtime.journal


def _failing_helper_sync(monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], dict[str, bool]]:
    """Once ``arm["on"]`` is set, the sync helper's next answer is held back (``held``: call it to
    deliver it) and then reports EIO, as a failed fdatasync would."""
    held: list[Any] = []
    arm = {"on": False}
    orig_post = SyncHelper.post

    def post(self: SyncHelper, op: int, fd: int, cb: Any, *args: Any) -> bool:
        if not arm["on"]:
            return orig_post(self, op, fd, cb, *args)
        arm["on"] = False

        def gated(*a: Any) -> None:  # (..., error, seconds): hold, then report EIO
            held.append(lambda: cb(*a[:-2], OSError(errno.EIO, "injected EIO in the helper's fdatasync"), a[-1]))
        return orig_post(self, op, fd, gated, *args)

    monkeypatch.setattr(SyncHelper, "post", post)
    return held, arm


async def _until(pred: Any, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        assert loop.time() < end
        await asyncio.sleep(0.005)


# 1. data loss: a journal failure while a checkpoint makes the spare inverts segment order
async def test_a_journal_failure_during_a_checkpoint_keeps_segments_in_order(tmp_path: Path) -> None:
    faults = GatedFaults()
    data = tmp_path / "d"
    runtime = await started(journal_config(data), faults)
    shard = runtime.shards[0]
    cp = ckpt(runtime)
    assert await append(shard, [commit("g", 0, 1)]) == OK
    assert await cp.checkpoint()                       # a spare exists now
    assert await append(shard, [commit("g", 0, 2)]) == OK
    faults.j.gate = threading.Event()
    task = asyncio.ensure_future(cp.checkpoint())      # rotate (uses spare), reserve seq S, thread: syncfs...
    await asyncio.get_running_loop().run_in_executor(None, faults.j.entered.wait, 5)
    faults.fail_next_journal_write = True              # ENOSPC on the journal in that window
    assert await append(shard, [commit("g", 0, 3)]) == ErrorCode.NOT_COORDINATOR
    await wait_state(shard, ShardState.ACTIVE)
    assert await append(shard, [commit("g", 0, 4)]) == OK   # goes to a new segment S+1 (no spare yet)
    faults.j.gate.set()
    assert await task                                   # spare S made
    assert await cp.checkpoint()                        # rotates to the spare S < S+1
    assert await append(shard, [commit("g", 0, 5)]) == OK   # acknowledged, in segment S
    crashed = tmp_path / "crashed"
    shutil.copytree(data, crashed)                      # what kill -9 leaves (page cache == files)
    await stop(runtime)
    again = await started(journal_config(crashed))
    try:
        assert committed(again) == OffsetAndMetadata(5, -1, "m", 1)
    finally:
        await stop(again)


# 2. wrong failure: startup entries of an applied partition kept while another partition is unapplied
async def test_a_partition_that_never_loads_leaves_no_gap_for_the_others(tmp_path: Path) -> None:
    data = tmp_path / "d"
    runtime = await started(journal_config(data, partitions=2))
    assert await append(runtime.shards[0], [commit("a", 0, 1)]) == OK
    assert await append(runtime.shards[1], [commit("b", 0, 1)]) == OK
    assert await ckpt(runtime).checkpoint()  # offset 0 of each is in its log only, from here on
    assert await append(runtime.shards[0], [commit("a", 0, 1)]) == OK
    assert await append(runtime.shards[1], [commit("b", 0, 1)]) == OK
    crashed = tmp_path / "crashed"
    shutil.copytree(data, crashed)   # kill -9
    await stop(runtime)
    # partition 1's first batch (not in the journal any more) is damaged below its recovery point: it
    # stays FAILED (never applies its journal entries)
    seg = crashed / "__consumer_offsets-1" / "00000000000000000000.log"
    raw = bytearray(seg.read_bytes())
    raw[30] ^= 0xFF
    seg.write_bytes(bytes(raw))
    (crashed / "__consumer_offsets-1" / "recovery-point").write_text(f"0 {len(raw)}\n")
    faults = Faults()
    runtime = await started(journal_config(crashed, partitions=2), faults)
    p0 = runtime.shards[0]
    assert runtime.shards[1].state is ShardState.FAILED and p0.state is ShardState.ACTIVE
    await _until(lambda: journal_of(runtime).unapplied == set())  # its batches were kept beside its log
    assert [p.name for p in (crashed / "__consumer_offsets-1").glob("journal-batches.*.tr")] == ["journal-batches.0.tr"]
    cp = ckpt(runtime)
    assert await append(p0, [commit("a", 0, 2)]) == OK
    assert await cp.checkpoint()           # this segment (offset 1 of p0) is deleted
    assert await cp.checkpoint()
    assert await append(p0, [commit("a", 0, 3)]) == OK
    faults.fail_next_journal_write = True  # any write failure makes p0 reload
    assert await append(p0, [commit("a", 0, 4)]) == ErrorCode.NOT_COORDINATOR
    await wait_state(p0, ShardState.ACTIVE, ShardState.FAILED)
    await asyncio.sleep(0.2)
    try:
        assert p0.state is ShardState.ACTIVE
        assert p0.data.committed("a", "t", 0) == OffsetAndMetadata(3, -1, "m", 1)
    finally:
        await stop(runtime)


# 3. wrong failure: a checkpoint records a recovery point past the durable end
async def test_a_checkpoint_never_claims_bytes_whose_journal_sync_then_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(coordinator.checkpointer, "CLAIM_INTERVAL_S", 0.0)
    monkeypatch.setattr(storage.log, "CHECKPOINT_INTERVAL_S", 0.0)
    faults = Faults()
    runtime = await started(journal_config(tmp_path, sync_helper=False), faults)
    shard = runtime.shards[0]
    assert await append(shard, [commit("g", 0, 1)]) == OK
    faults.hold_sync = threading.Event()
    faults.fail_next_sync = True
    pending = append(shard, [commit("g", 0, 2)])      # journal written, its fdatasync held on the writer
    await asyncio.get_running_loop().run_in_executor(None, faults.sync_held.wait, 5)
    assert await ckpt(runtime).checkpoint()    # syncfs + claim at the in-flight cycle's end
    faults.hold_sync.set()
    faults.hold_sync = None
    assert await pending == ErrorCode.NOT_COORDINATOR  # the journal sync failed
    await wait_state(shard, ShardState.ACTIVE, ShardState.FAILED)
    await asyncio.sleep(0.2)
    try:
        assert shard.state is ShardState.ACTIVE
    finally:
        await stop(runtime)


async def test_a_log_whose_journal_sync_was_in_flight_at_a_checkpoint_is_marked_synced_by_the_next(
        tmp_path: Path) -> None:
    """A checkpoint that runs while a batch's journal sync is in flight cannot count that batch as
    synced in its log (it is not acknowledged yet). It rotated the journal, so the live segment is empty
    once the sync is back: the checkpoints that follow used to wait for something new to be journaled,
    and a server going idle then kept the log behind (its recovery point too) until its stop (a flaky
    test's find, under load). Now a log behind is itself a reason for the next checkpoint."""
    faults = Faults()
    runtime = await started(journal_config(tmp_path, sync_helper=False, checkpoint_interval_ms=50), faults)
    shard, checkpointer = runtime.shards[0], ckpt(runtime)
    loop = asyncio.get_running_loop()
    try:
        faults.hold_sync = threading.Event()
        pending = append(shard, [commit("g", 0, 1)])
        assert await loop.run_in_executor(None, faults.sync_held.wait, 5)
        before = checkpointer.completed
        while checkpointer.completed == before:  # one runs while the journal sync is held
            await asyncio.sleep(0.01)
        assert shard.log.synced_offset == 0
        faults.hold_sync.set()
        faults.hold_sync = None
        assert await pending == OK
        deadline = loop.time() + 10
        while shard.log.disk_behind():
            assert loop.time() < deadline, "the log stayed behind its acknowledged end"
            await asyncio.sleep(0.01)
        assert shard.log.synced_offset == 1
    finally:
        await stop(runtime)


# 4. availability: fd of a segment rotated and deleted while its sync is in flight is never closed
async def test_a_segment_deleted_while_its_sync_runs_has_its_descriptor_closed(tmp_path: Path) -> None:
    faults = Faults()
    runtime = await started(journal_config(tmp_path, sync_helper=False), faults)
    shard = runtime.shards[0]
    journal = journal_of(runtime)
    assert await append(shard, [commit("g", 0, 1)]) == OK
    faults.hold_sync = threading.Event()
    pending = append(shard, [commit("g", 0, 2)])
    await asyncio.get_running_loop().run_in_executor(None, faults.sync_held.wait, 5)
    seg = journal.in_flight
    assert seg is not None
    assert await ckpt(runtime).checkpoint()    # rotates, deletes seg, journal.deleted pops it
    faults.hold_sync.set()
    faults.hold_sync = None
    assert await pending == OK
    try:
        assert seg.fd is None, f"segment {seg.seq} fd {seg.fd} still open"
    finally:
        await stop(runtime)


# 5. refused batches: a log's batches that a failed partition had appended stay out of the journal, and
# marking it refused needs no lock (one attribute, set on the loop; discard() rebuilt lists on the
# writer thread while the loop appended to them, and lost other partitions' batches)
def test_a_refused_logs_batches_are_left_out_of_the_journal_write(tmp_path: Path) -> None:
    from storage.journalentries import read_entries
    from storage.log import PartitionLog
    from tests.storage.test_journal import batch
    journal = Journal(tmp_path)
    p, q = PartitionLog(tmp_path / "p"), PartitionLog(tmp_path / "q")
    for i in range(3):
        journal.add(p, 1, batch(i), (i + 1, 0, 0))
        journal.add(q, 2, batch(i), (i + 1, 0, 0))
    p.refused = True
    seg, _ = journal.write()
    assert [(part, b) for part, b, _ in read_entries(seg.path)] == [(2, batch(i)) for i in range(3)]
    assert q.journaled_end == (3, 0, 0)
    journal.close(remove=True)


# 6. refused (written-ahead) commits of a failed shard are journaled by the next cycle and come back
async def test_a_failed_partitions_written_ahead_batch_does_not_come_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    held, arm = _failing_helper_sync(monkeypatch)
    data = tmp_path / "d"
    runtime = await started(journal_config(data, partitions=3))
    a, b, c = runtime.shards
    assert all([await append(s, [commit("x", 0, 1)]) == OK for s in (a, b, c)])
    arm["on"] = True
    fa = append(a, [commit("x", 0, 2)])
    await _until(lambda: held)                 # A's cycle is with the helper (answer held)
    fb = append(b, [commit("x", 0, 2)])        # B appends ahead (page cache + journal pending)
    await _until(lambda: b.written_ahead)
    fc = append(c, [commit("x", 0, 2)])        # C opens a batch in the same pass the answer comes in
    held.pop()()
    assert await fa == ErrorCode.NOT_COORDINATOR
    assert await fb == ErrorCode.NOT_COORDINATOR  # refused
    assert await fc == OK
    for s in (a, b):
        await wait_state(s, ShardState.ACTIVE)
    crashed = tmp_path / "crashed"
    shutil.copytree(data, crashed)
    await stop(runtime)
    again = await started(journal_config(crashed, partitions=3))
    after = again.shards[1].data.committed("x", "t", 0)
    await stop(again)
    assert after == OffsetAndMetadata(1, -1, "m", 1)


# 2b. same root cause, no corruption needed: failed checkpoint while a partition is READ_ONLY, then a CLEAN stop
async def test_a_read_only_partition_reloads_after_a_failed_checkpoint(tmp_path: Path) -> None:
    faults = Faults()
    runtime = await started(journal_config(tmp_path, partitions=2), faults)
    p0, p1 = runtime.shards
    cp = ckpt(runtime)
    assert await append(p0, [commit("a", 0, 1)]) == OK
    faults.disk_full = True
    assert await append(p1, [commit("b", 0, 1)]) == ErrorCode.NOT_COORDINATOR
    await wait_state(p1, ShardState.READ_ONLY)              # disk full: p1 serves reads only
    faults.fail_next_checkpoint = True
    assert not await cp.checkpoint()                          # e.g. writeback ENOSPC/EIO
    faults.disk_full = False
    await wait_state(p0, ShardState.ACTIVE)
    await wait_state(p1, ShardState.ACTIVE)                   # probe ok -> ACTIVE, never recovers/applies
    assert await append(p0, [commit("a", 0, 2)]) == OK        # into the held segment
    assert await cp.checkpoint()
    assert await append(p0, [commit("a", 0, 3)]) == OK        # into a segment past the hold
    assert await cp.checkpoint()                              # ... which is deleted
    assert await append(p0, [commit("a", 0, 4)]) == OK
    await stop(runtime)                                       # clean stop: journal kept (unapplied)
    again = await started(journal_config(tmp_path, partitions=2))
    try:
        assert again.shards[0].state is ShardState.ACTIVE
        assert again.shards[0].data.committed("a", "t", 0) == OffsetAndMetadata(4, -1, "m", 1)
    finally:
        await stop(again)


# 7. crash during recovery's rewrite, after a restart that recorded a claim while startup segments remained
def test_a_crash_between_a_recoverys_cut_and_its_rewrite_loses_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from storage.log import PartitionLog
    from tests.storage.test_journal import acknowledged, batch, opened, recovered
    journal, plog = opened(tmp_path)
    acknowledged(journal, plog, [batch(0), batch(1), batch(2)])
    plog.close()
    journal.close(remove=False)  # kill -9 (1st process)
    journal, plog, offsets = recovered(tmp_path)             # 2nd process: rewrites, records claim at the end
    assert offsets == [0, 1, 2]
    plog.close()
    journal.close(remove=False)  # killed before its first checkpoint
    journal, plog = opened(tmp_path, recover=False)          # 3rd process: killed mid-rewrite
    orig = PartitionLog._append_run

    def killed(self: PartitionLog, run: list[bytes], servable: bool, replayable: bool) -> Any:
        raise KeyboardInterrupt("kill -9 after _clear_for_run truncated the log")
        yield  # pragma: no cover
    monkeypatch.setattr(PartitionLog, "_append_run", killed)
    with pytest.raises(KeyboardInterrupt):
        list(plog.recover())
    monkeypatch.setattr(PartitionLog, "_append_run", orig)
    plog.close()
    journal.close(remove=False)
    journal, plog, offsets = recovered(tmp_path)             # 4th process: the journal still has 0..2
    assert offsets == [0, 1, 2]


# 8. data loss: checkpoint marks the in-flight (unacknowledged) cycle synced -> cleaner drops an acked record
async def test_the_cleaner_never_lets_an_unacknowledged_record_hide_an_acknowledged_one(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    held, arm = _failing_helper_sync(monkeypatch)
    runtime = await started(journal_config(tmp_path, segment_bytes=1024))
    shard = runtime.shards[0]
    for i in range(1, 10):                       # offsets 0..8 fill segment 0
        assert await append(shard, [commit("g", 0, i)]) == OK
    assert len(shard.log.segments) == 1
    arm["on"] = True
    failing = append(shard, [commit("g", 0, 10)])  # rolls segment 9; its journal fdatasync will fail
    await _until(lambda: held)
    assert await ckpt(runtime).checkpoint()  # syncfs; synced_offset := 10 > durable_offset 9
    await runtime.compactors[0].compact(0)
    held.pop()()
    assert await failing == ErrorCode.NOT_COORDINATOR
    await wait_state(shard, ShardState.ACTIVE, ShardState.FAILED)
    await asyncio.sleep(0.2)
    got = shard.data.committed("g", "t", 0)
    await stop(runtime)
    d = tmp_path / "__consumer_offsets-0"
    (d / "recovery-point").unlink()                  # operator "repairs" the claim: what is on disk?
    again = await started(journal_config(tmp_path, segment_bytes=1024))
    on_disk = again.shards[0].data.committed("g", "t", 0)
    await stop(again)
    assert got == on_disk == OffsetAndMetadata(9, -1, "m", 1)


# 9. data loss on kill -9: a checkpoint deletes the journal segments a reloading partition is rewriting from


class GatedLog(FaultyLog):
    def _clear_for_run(self, index: int, position: int, run: list[bytes]) -> None:
        super()._clear_for_run(index, position, run)
        faults = self.faults
        if isinstance(faults, GatedLogFaults) and faults.gate is not None:
            faults.in_gate.set()
            faults.gate.wait(10)


class GatedLogFaults(Faults):
    def __init__(self) -> None:
        super().__init__()
        self.gate: threading.Event | None = None
        self.in_gate = threading.Event()  # per instance: one left set would not hold the next test

    def factory(self, directory: Path, segment_bytes: int) -> Any:
        return GatedLog(directory, segment_bytes, self)


async def _reload_held_after_its_cut(shard: Shard, faults: GatedLogFaults) -> threading.Event:
    """Commits 1 and 2 acknowledged (in the journal only), then a failed journal write reloads the
    partition; returns once its recovery has cut the log back to the journal run's start and waits
    at ``faults.gate`` (returned: set it to let the recovery go on)."""
    assert await append(shard, [commit("g", 0, 1)]) == OK
    assert await append(shard, [commit("g", 0, 2)]) == OK
    faults.gate = gate = threading.Event()
    faults.fail_next_journal_write = True
    assert await append(shard, [commit("g", 0, 3)]) == ErrorCode.NOT_COORDINATOR
    await asyncio.get_running_loop().run_in_executor(None, faults.in_gate.wait, 5)
    return gate


async def test_no_segment_is_deleted_while_a_partition_rewrites_from_it(tmp_path: Path) -> None:
    faults = GatedLogFaults()
    data = tmp_path / "d"
    runtime = await started(journal_config(data), faults)
    shard = runtime.shards[0]
    gate = await _reload_held_after_its_cut(shard, faults)
    assert await ckpt(runtime).checkpoint()              # partition not "recovered": not held
    crashed = tmp_path / "crashed"
    shutil.copytree(data, crashed)                               # kill -9 now
    gate.set()
    await wait_state(shard, ShardState.ACTIVE)
    await stop(runtime)
    assert await committed_at_a_start(journal_config(crashed)) == OffsetAndMetadata(2, -1, "m", 1)


# 10. data loss (a fault campaign's full disk): a recovery that failed half-way through its rewrite
# (ENOSPC) was retried after checkpoints had moved on, read no batches back, and served a log cut short
async def test_a_recovery_retried_after_a_failed_rewrite_still_rewrites_everything(tmp_path: Path) -> None:
    faults = GatedLogFaults()
    runtime = await started(journal_config(tmp_path), faults)
    shard = runtime.shards[0]
    gate = await _reload_held_after_its_cut(shard, faults)
    faults.fail_next_append = True  # the rewrite's first append fails: the disk is full
    gate.set()
    faults.gate = None
    await asyncio.sleep(0.05)
    for _ in range(3):
        assert await ckpt(runtime).checkpoint()  # the checkpoints move on while it retries
    await wait_state(shard, ShardState.ACTIVE)
    assert committed(runtime) == OffsetAndMetadata(2, -1, "m", 1)
    await stop(runtime)
    assert await committed_at_a_start(journal_config(tmp_path)) == OffsetAndMetadata(2, -1, "m", 1)



# 11. a partition FAILED after a crash (a fault campaign's find): while segments were kept for a partition
# still recovering, checkpoints counted the other logs synced past them, the cleaner compacted there, and
# the start after the crash replayed the kept segments into the compacted log ("segments were removed")
async def test_no_log_is_compacted_into_what_the_kept_segments_replay(tmp_path: Path) -> None:
    faults = GatedLogFaults()
    data = tmp_path / "d"
    runtime = await started(journal_config(data, partitions=2, segment_bytes=1024), faults)
    held, busy = runtime.shards
    offset = 0
    for _ in range(30):  # a few segments of one key
        offset += 1
        assert await append(busy, [commit("g", 0, offset)]) == OK
    assert await ckpt(runtime).checkpoint()
    gate = await _reload_held_after_its_cut(held, faults)  # partition 0 recovering: segments are kept
    synced = busy.log.synced_offset
    for _ in range(40):
        offset += 1
        assert await append(busy, [commit("g", 0, offset)]) == OK
    assert await ckpt(runtime).checkpoint()
    assert busy.log.synced_offset == synced  # not past what the kept segments hold
    await runtime.compactors[1].compact(0)
    crashed = tmp_path / "crashed"
    shutil.copytree(data, crashed)  # kill -9
    gate.set()
    await wait_state(held, ShardState.ACTIVE)
    await stop(runtime)
    for _ in range(2):  # the start after the crash, and one after it (what it wrote is read back)
        again = await started(journal_config(crashed, partitions=2, segment_bytes=1024))
        state, got = again.shards[1].state, again.shards[1].data.committed("g", "t", 0)
        await stop(again)
        assert (state, got) == (ShardState.ACTIVE, OffsetAndMetadata(offset, -1, "m", 1))


async def _checkpoint_held_on_its_thread(tmp_path: Path) -> tuple[Runtime, threading.Event]:
    """A runtime whose periodic checkpoint is under way on its thread, held at ``make_spare`` until the
    returned gate is set."""
    faults = GatedFaults()
    runtime = await started(journal_config(tmp_path / "d", checkpoint_interval_ms=50), faults)
    faults.j.gate = gate = threading.Event()
    GatedJournal.entered.clear()
    assert await append(runtime.shards[0], [commit("g", 0, 1)]) == OK
    assert await asyncio.get_running_loop().run_in_executor(None, GatedJournal.entered.wait, 5)
    return runtime, gate


async def test_a_stop_waits_for_a_checkpoint_under_way_before_letting_go_of_the_journal(tmp_path: Path) -> None:
    """The checkpoint thread renames and deletes journal segments by number. A stop cancelled its task
    and closed the journal and the directory's lock while the thread went on: a kcoord started on the
    directory meanwhile had its live segment renamed under it, and its journaled commits were not
    replayed after a crash (a campaign's find, with a slow checkpoint). The stop waits for it now."""
    loop = asyncio.get_running_loop()
    runtime, gate = await _checkpoint_held_on_its_thread(tmp_path)
    stopping = asyncio.ensure_future(runtime.stop(loop.time() + 10))
    await asyncio.sleep(0.3)
    assert not stopping.done()
    gate.set()
    assert await stopping is True
    assert runtime._lock is None
    again = await started(journal_config(tmp_path / "d"))
    try:
        assert committed(again) == OffsetAndMetadata(1, -1, "m", 1)
    finally:
        await stop(again)


async def test_a_checkpoint_stuck_past_the_stop_deadline_keeps_the_directory(tmp_path: Path) -> None:
    """Past the deadline the stop gives up (the process then exits 1 at once, coordinator.cli) and
    keeps the journal open and the directory locked, so no other kcoord starts on it while the
    thread may still touch it."""
    loop = asyncio.get_running_loop()
    runtime, gate = await _checkpoint_held_on_its_thread(tmp_path)
    try:
        assert await runtime.stop(loop.time() + 0.3) is False
        assert runtime._lock is not None
    finally:
        gate.set()
        ckpt(runtime)._thread.shutdown(wait=True)
        if runtime._lock is not None:
            os.close(runtime._lock)


async def test_a_stop_waits_for_recovery_points_being_recorded_on_the_checkpoint_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same for the checkpoint's last step, recording recovery points (files written and renamed in
    every partition's directory): cancelled, it went on after the stop had let go of the directory.
    Claims are due at once: with the log's own 1 s between them, the checkpoint that catches the log
    up after the append (the next test's case, every time under load) may come before one is due,
    and none follows it."""
    monkeypatch.setattr(coordinator.checkpointer, "CLAIM_INTERVAL_S", 0.0)
    monkeypatch.setattr(storage.log, "CHECKPOINT_INTERVAL_S", 0.0)
    loop = asyncio.get_running_loop()
    runtime = await started(journal_config(tmp_path / "d", checkpoint_interval_ms=50))
    sync = ckpt(runtime)._sync
    gate, entered = threading.Event(), threading.Event()
    real = sync.record

    def held(claims: Any) -> None:
        entered.set()
        gate.wait(10)
        real(claims)

    monkeypatch.setattr(sync, "record", held)
    assert await append(runtime.shards[0], [commit("g", 0, 1)]) == OK
    assert await loop.run_in_executor(None, entered.wait, 5)
    stopping = asyncio.ensure_future(runtime.stop(loop.time() + 10))
    await asyncio.sleep(0.3)
    assert not stopping.done()
    gate.set()
    assert await stopping is True
