"""Syncing many logs at once: one syncfs per file system once its watcher is open, per-file fsyncs
for a lone log or a file system seen for the first time, and an error that fails every log of the
cycle on that file system without moving any durable end."""

import errno
import os
import threading
from pathlib import Path

import pytest

import storage.log
import storage.sync
from storage.batchwriter import build_batch
from storage.log import RECOVERY_POINT, PartitionLog
from storage.sync import SYNCFS, FileSync, FilesystemSync, make_sync
from storage.synchelper import OP_FSYNC, OP_SYNCFS

T = 1700000000000
pytestmark = pytest.mark.skipif(SYNCFS is None, reason="syncfs needs Linux 5.8+ (errors reported through it)")


class CountingSyncfs:
    """The real syncfs, counted; ``fail`` makes the next call report a writeback error instead."""

    def __init__(self) -> None:
        self.calls = 0
        self.fail = False
        self.fail_call = 0  # or fail the call with this number
        self.threads: list[str] = []  # the calling thread's name and the descriptor, per call
        self.fds: list[int] = []

    def __call__(self, fd: int) -> None:
        self.calls += 1
        self.threads.append(threading.current_thread().name)
        self.fds.append(fd)
        if self.fail or self.calls == self.fail_call:
            self.fail = False
            raise OSError(errno.EIO, "syncfs: Input/output error (injected)")
        assert SYNCFS is not None
        SYNCFS(fd)


@pytest.fixture(autouse=True)
def no_recovery_points_due(monkeypatch: pytest.MonkeyPatch) -> None:
    """Recovery points (one a second) would add syncfs calls on a slow run; the test that wants them
    sets its own interval."""
    monkeypatch.setattr(storage.log, "CHECKPOINT_INTERVAL_S", 3600.0)


def logs(tmp_path: Path, n: int) -> list[PartitionLog]:
    out = []
    for i in range(n):
        plog = PartitionLog(tmp_path / f"__consumer_offsets-{i}")
        list(plog.recover())
        out.append(plog)
    return out


def append(plog: PartitionLog) -> None:
    base = plog.next_offset
    plog.append(build_batch(base, [(b"\x00\x01k%d" % base, b"v" * 40)], T), base)


def durable_then_pending(sync: FileSync, group: list[PartitionLog]) -> None:
    """Each log gets a record made durable by ``sync``, then one more appended and not yet synced."""
    for plog in group:
        append(plog)
    assert sync.sync(group) == [None] * len(group)
    for plog in group:
        append(plog)


def test_a_cycle_of_many_logs_takes_one_syncfs_once_the_file_system_is_watched(tmp_path: Path) -> None:
    syncfs = CountingSyncfs()
    sync = FilesystemSync(syncfs)
    group = logs(tmp_path, 5)
    for plog in group:
        append(plog)
    assert sync.sync(group) == [None] * 5  # first sight of this file system: per-file fsyncs
    # none by the cycle itself; the recorder's first recording, off the cycle, may already have made one
    assert all(name.startswith("kcoord-checkpoint") for name in syncfs.threads)
    assert [p.durable_offset for p in group] == [1] * 5
    sync.wait_recorded(10)  # the logs' first recovery points, off the cycle
    syncfs.calls = 0
    for plog in group:
        append(plog)
    assert sync.sync(group) == [None] * 5
    assert syncfs.calls == 1
    assert [p.durable_offset for p in group] == [2] * 5
    append(group[0])
    assert sync.sync(group[:1]) == [None]  # a lone log: its own fsync
    assert syncfs.calls == 1 and group[0].durable_offset == 3
    sync.close()


def test_a_syncfs_error_fails_every_log_of_the_cycle_and_moves_no_durable_end(tmp_path: Path) -> None:
    syncfs = CountingSyncfs()
    sync = FilesystemSync(syncfs)
    group = logs(tmp_path, 3)
    durable_then_pending(sync, group)
    syncfs.fail = True
    results = sync.sync(group)
    assert all(isinstance(r, OSError) and r.errno == errno.EIO for r in results)
    assert [p.durable_offset for p in group] == [1, 1, 1]  # the second records are not durable
    for plog in group:
        plog.truncate_to_durable()
        assert plog.next_offset == 1
    sync.close()


def test_fsync_mode_never_uses_syncfs(tmp_path: Path) -> None:
    sync = make_sync("fsync")
    assert type(sync) is FileSync
    group = logs(tmp_path, 4)
    for plog in group:
        append(plog)
    assert sync.sync(group) == [None] * 4
    assert [p.durable_offset for p in group] == [1] * 4
    sync.close()
    assert isinstance(make_sync("syncfs"), FilesystemSync)


def hold_recordings(sync: FilesystemSync, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Recordings wait for the returned event before doing their work."""
    gate = threading.Event()
    real_record = sync._record

    def held_record(claims: list[tuple[PartitionLog, tuple[int, int]]]) -> None:
        assert gate.wait(10)
        real_record(claims)

    monkeypatch.setattr(sync, "_record", held_record)
    return gate


def test_due_recovery_points_are_recorded_together_off_the_cycle(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage.log, "CHECKPOINT_INTERVAL_S", 0.0)  # every sync is due
    monkeypatch.setattr(storage.sync, "RECORD_SPACING_S", 0.0)
    syncfs = CountingSyncfs()
    sync = FilesystemSync(syncfs)
    group = logs(tmp_path, 3)
    for plog in group:  # the file system's first cycle syncs file by file while its watcher opens
        append(plog)
    assert sync.sync(group) == [None] * 3
    assert sync.wait_recorded(10)  # the first claims (that cycle fsynced file by file)
    syncfs.calls = 0
    syncfs.threads.clear()
    syncfs.fds.clear()
    for plog in group:
        append(plog)
    assert sync.sync(group) == [None] * 3
    assert sync.wait_recorded(10)
    assert syncfs.calls == 3  # the data's syncfs, then the recorder's: before and after renaming the claims
    watcher = list(sync._watchers.values())
    assert syncfs.fds[0] in watcher and not set(syncfs.fds[1:]) & set(watcher)  # the recorder's own descriptor
    assert syncfs.threads[0] == threading.current_thread().name  # the cycle's thread
    assert all(t.startswith("kcoord-checkpoint") for t in syncfs.threads[1:])
    for plog in group:
        base, position = (plog.directory / RECOVERY_POINT).read_text().split()
        assert (int(base), int(position)) == (0, plog.segments[-1].size)
        assert sorted(p.name for p in plog.directory.iterdir()) == ["00000000000000000000.log", RECOVERY_POINT]
    sync.close()


def test_a_claim_is_the_one_taken_at_its_sync_and_a_failed_recording_keeps_the_old_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorder writes the claim taken right after the sync that made it true, even when more has
    been appended (not yet durable) by the time it runs; and when its flush fails, the claim on disk
    stays the older, true one."""
    monkeypatch.setattr(storage.log, "CHECKPOINT_INTERVAL_S", 0.0)
    monkeypatch.setattr(storage.sync, "RECORD_SPACING_S", 0.0)
    syncfs = CountingSyncfs()
    sync = FilesystemSync(syncfs)
    group = logs(tmp_path, 2)
    for plog in group:
        append(plog)
    assert sync.sync(group) == [None] * 2  # first cycle: per file, claims of size 1 batch
    assert sync.wait_recorded(10)
    one_batch = group[0].segments[-1].size
    for plog in group:
        append(plog)
    gate = hold_recordings(sync, monkeypatch)
    assert sync.sync(group) == [None] * 2  # claims of two batches taken now
    assert sync._recording is not None and not sync._recording.done()  # the cycle did not wait for it
    for plog in group:
        append(plog)  # a third batch, not durable, appended while the recorder waits
    gate.set()
    assert sync.wait_recorded(10)
    for plog in group:
        assert (plog.directory / RECOVERY_POINT).read_text().split() == ["0", str(2 * one_batch)]
    monkeypatch.undo()  # the recorder as it is (and the intervals back: set them again)
    monkeypatch.setattr(storage.log, "CHECKPOINT_INTERVAL_S", 0.0)
    monkeypatch.setattr(storage.sync, "RECORD_SPACING_S", 0.0)
    syncfs.calls = 0
    syncfs.fail_call = 2  # the data's syncfs succeeds; the recorder's first flush fails
    assert sync.sync(group) == [None] * 2
    assert sync.wait_recorded(10)
    assert syncfs.calls == 2
    for plog in group:
        assert (plog.directory / RECOVERY_POINT).read_text().split() == ["0", str(2 * one_batch)]
        assert plog.durable_offset == 3
    sync.close()


def test_a_late_recording_never_replaces_a_newer_claim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim taken before a log recorded a newer one itself (a clean close, a compaction swap) must
    not be put back over it when the recorder gets to it."""
    monkeypatch.setattr(storage.log, "CHECKPOINT_INTERVAL_S", 0.0)
    monkeypatch.setattr(storage.sync, "RECORD_SPACING_S", 0.0)
    sync = FilesystemSync(CountingSyncfs())
    group = logs(tmp_path, 2)
    for plog in group:
        append(plog)
    assert sync.sync(group) == [None] * 2
    assert sync.wait_recorded(10)
    gate = hold_recordings(sync, monkeypatch)
    for plog in group:
        append(plog)
    assert sync.sync(group) == [None] * 2  # claims of two batches, held
    for plog in group:
        append(plog)
        plog.sync()  # as a closing shard does: fsync and record the current claim, three batches
    newest = [(p.directory / RECOVERY_POINT).read_text() for p in group]
    gate.set()
    assert sync.wait_recorded(10)
    assert [(p.directory / RECOVERY_POINT).read_text() for p in group] == newest
    assert newest[0].split()[1] == str(group[0].segments[-1].size)
    for plog in group:
        assert sorted(p.name for p in plog.directory.iterdir()) == ["00000000000000000000.log", RECOVERY_POINT]
    sync.close()


def test_a_cycle_is_planned_as_one_system_call_once_its_files_are_known(tmp_path: Path) -> None:
    """What the sync helper process is asked to do (storage.synchelper): one syncfs for several logs of a
    watched file system, one fsync for a lone log, and nothing (the writer thread's ``sync``) while a
    log has a new segment or the file system is new. Done here as the helper does it."""
    syncfs = CountingSyncfs()
    sync = FilesystemSync(syncfs)
    group = logs(tmp_path, 3)
    for plog in group:
        append(plog)  # each log's first segment: a directory entry to make durable too
    assert [plog.sync_fd() for plog in group] == [None] * 3
    assert sync.plan(group) is None and sync.plan(group[:1]) is None  # a file system not seen yet
    assert sync.sync(group) == [None] * 3
    for plog in group:
        append(plog)
    planned = sync.plan(group)
    assert planned is not None and planned[0] == OP_SYNCFS and planned[1] in sync._watchers.values()
    assert SYNCFS is not None
    ends = [plog.end() for plog in group]
    SYNCFS(planned[1])
    assert sync.planned_done(group, None, ends) == [None] * 3
    assert [p.durable_offset for p in group] == [2] * 3
    append(group[0])
    planned = sync.plan(group[:1])
    assert planned == (OP_FSYNC, group[0].sync_fd()) and planned[1] is not None
    end = group[0].end()
    os.fsync(planned[1])
    append(group[0])  # appended while the sync was under way: not covered by it
    assert sync.planned_done(group[:1], None, [end]) == [None] and group[0].durable_offset == 3
    assert group[0].claim() == end[1:] and group[0].end() != end
    for plog in group:
        append(plog)
    failed = sync.planned_done(group, OSError(errno.EIO, "the helper's syncfs failed"),
                               [plog.end() for plog in group])
    assert all(isinstance(r, OSError) and r.errno == errno.EIO for r in failed)
    assert [p.durable_offset for p in group] == [3, 2, 2]  # no durable end moved
    sync.close()


def test_a_new_segment_needs_the_writer_threads_sync(tmp_path: Path) -> None:
    plog = PartitionLog(tmp_path / "__consumer_offsets-0", segment_bytes=200)
    list(plog.recover())
    append(plog)
    plog.sync()
    assert plog.sync_fd() is not None
    append(plog)  # past 200 bytes: a new segment, and an older one not yet durable
    assert len(plog.segments) == 2 and plog.sync_fd() is None
    assert FileSync().plan([plog]) is None
    plog.sync()
    assert plog.sync_fd() is not None


def test_fsync_mode_plans_only_a_lone_log_without_a_recovery_point_due(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    sync = make_sync("fsync")
    group = logs(tmp_path, 2)
    durable_then_pending(sync, group)
    assert sync.plan(group) is None  # several files: fsynced in parallel by ``sync``
    assert sync.plan(group[:1]) == (OP_FSYNC, group[0].sync_fd())
    monkeypatch.setattr(storage.log, "CHECKPOINT_INTERVAL_S", 0.0)
    assert sync.plan(group[:1]) is None  # its recovery point is recorded in the cycle, by ``sync``
    sync.close()
