"""Making many partition logs durable at once.

A durable commit costs an fsync of its partition's log, and commits spread over many partitions cost
one fsync each: 44 dirty logs take ~5.4 ms of sequential fdatasync here, ~3.5-4.2 ms from 8 or 44
threads, but ~1.0 ms with one ``syncfs`` of their file system (bench: /work's ext4; 1 log: ~0.17 ms
either way). ``FilesystemSync`` therefore syncs a cycle of two or more logs with one ``syncfs`` per
file system, and a lone log with its own fsyncs.

Errors: since Linux 5.8 ``syncfs`` reports a writeback error that happened anywhere on the file system
since the descriptor it is given last saw one (the super block's error sequence is sampled when the
descriptor is opened and advanced by each ``syncfs``). So each file system gets one descriptor kept
open from its first use on, and a cycle that finds a file system new syncs its logs one by one while
that descriptor starts watching; an error fails every log of the cycle on that file system (it cannot
be attributed), which then reload and cut their unacknowledged tails. Older kernels report nothing
through ``syncfs``, so there, and where libc lacks it, every log is fsynced on its own.

The cost of ``syncfs``: it also writes out other programs' dirty data on the same file system. Give
the data directory a file system of its own when latency matters (``--sync-mode fsync`` opts out).

With ``syncfs``, recovery points (storage.log) are recorded off the commit path, by a recorder thread
of their own: recording a claim takes a temporary file, a rename and two flushes, and done inside a
cycle it held that cycle's commits for 1.4-20 ms (measured: ~22 such cycles a second at 4,200
commits/s over 44 partitions, the whole p99 of a paced load). The writer thread only takes the due
claims of the logs it has just made durable (a claim taken then stays true: durable bytes are never
cut) and hands them over. The recorder syncs through a descriptor of its own (``syncfs`` reports an
error once per descriptor, so the writer's watcher still sees every one), writes its temporary files
under a name nobody else uses, and never puts a claim back over a newer one (a closing log's, or
one recorded before a compaction swap: storage.log). A claim the recorder has not installed when the
process dies is simply an older claim on disk. With per-file fsyncs claims stay in the cycle (see
FileSync).
"""

import ctypes
import ctypes.util
import os
import platform
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Final

from storage.log import RECOVERY_POINT, LogEnd, PartitionLog
from storage.synchelper import OP_FSYNC, OP_SYNCFS

SyncResult = list[BaseException | None]  # per log, in order: None when it is durable
Claims = dict[str, tuple[PartitionLog, tuple[int, int]]]  # log directory -> (log, claim taken)
RECORDER_TMP = RECOVERY_POINT + ".recorder"  # the recorder's temporary claim file in each log directory
RECORD_SPACING_S = 0.25  # at most four recordings a second; claims due meanwhile wait and go together


def _load_syncfs() -> Callable[[int], None] | None:
    if platform.system() != "Linux":
        return None
    try:
        major, minor = (int(x) for x in platform.release().split(".")[:2])
    except ValueError:
        return None
    if (major, minor) < (5, 8):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int

    def syncfs(fd: int) -> None:
        if fn(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs: {os.strerror(err)}")

    return syncfs


SYNCFS: Final = _load_syncfs()


class FileSync:
    """Every log fsyncs its own files; several at once in parallel threads (the kernel may then share
    journal commits between them). Recovery points are recorded in the cycle, by each log's ``sync``:
    with per-file fsyncs a recorder of its own would fsync directories through descriptors opened
    at any moment, and a directory's writeback error reported to such a descriptor is not reported
    again to the writer's."""

    def __init__(self, parallel: int = 8) -> None:
        self._pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="kcoord-fsync")

    def sync(self, logs: Sequence[PartitionLog]) -> SyncResult:
        return self._sync_each(logs, checkpoint=True)

    def prepare(self, logs: Sequence[PartitionLog], ends: Sequence[LogEnd]) -> None:
        """On the event loop, as a cycle is posted, with each log's ``end()`` then (storage.journalsync
        writes its journal here)."""

    def settle(self, error: BaseException | None = None) -> None:
        """On the event loop, once a cycle's sync is over (storage.journalsync)."""

    def plan(self, logs: Sequence[PartitionLog]) -> tuple[int, int] | None:
        """The one system call (storage.synchelper's op and descriptor) that ``sync`` would make for
        ``logs``, when it is one, so the sync helper process can make it; None when ``sync`` is
        needed: several files (synced in parallel here), a new segment or directory entry, or a
        recovery point due (recorded in the cycle, by ``sync``)."""
        if len(logs) != 1 or logs[0].checkpoint_due():
            return None
        return _fsync_plan(logs[0])

    def planned_done(self, logs: Sequence[PartitionLog], error: BaseException | None,
                     ends: Sequence[LogEnd]) -> SyncResult:
        """On the event loop, after the planned call returned: what ``sync`` would have returned, each
        log durable up to its ``end()`` taken before the call was made (appends made since are not
        covered by it)."""
        return [error if error is not None else _synced(plog, end) for plog, end in zip(logs, ends, strict=True)]

    def _sync_each(self, logs: Sequence[PartitionLog], checkpoint: bool) -> SyncResult:
        if len(logs) == 1:
            return [_sync_one(logs[0], checkpoint)]
        return list(self._pool.map(_sync_one, logs, [checkpoint] * len(logs)))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class FilesystemSync(FileSync):
    """One ``syncfs`` per file system for a cycle of two or more logs (see the module docstring)."""

    def __init__(self, syncfs: Callable[[int], None]) -> None:
        super().__init__()
        self._syncfs = syncfs
        self._watchers: dict[int, int] = {}  # st_dev -> a descriptor opened on that file system
        self._devices: dict[str, int] = {}  # log directory -> its st_dev
        self._recorder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kcoord-checkpoint")
        self._recording: Future[None] | None = None
        self._recorded_at = 0.0
        self._due: Claims = {}

    def sync(self, logs: Sequence[PartitionLog]) -> SyncResult:
        results = self._sync_logs(logs)
        self._claims_due([plog for plog, error in zip(logs, results, strict=True) if error is None])
        return results

    def plan(self, logs: Sequence[PartitionLog]) -> tuple[int, int] | None:
        """One log: its fsync. Several: the syncfs of their file system, once this has a watcher
        there (the first cycle on a file system syncs file by file, in ``sync``). Recovery points are
        recorded off the cycle either way."""
        if len(logs) == 1:
            return _fsync_plan(logs[0])
        device = None
        for plog in logs:
            dev = self._devices.get(str(plog.directory))
            if dev is None or (device is not None and dev != device):
                return None
            device = dev
        watcher = self._watchers.get(device) if device is not None else None
        return None if watcher is None else (OP_SYNCFS, watcher)

    def planned_done(self, logs: Sequence[PartitionLog], error: BaseException | None,
                     ends: Sequence[LogEnd]) -> SyncResult:
        results = super().planned_done(logs, error, ends)
        self._claims_due([plog for plog, outcome in zip(logs, results, strict=True) if outcome is None])
        return results

    def _sync_logs(self, logs: Sequence[PartitionLog]) -> SyncResult:
        if len(logs) < 2:
            return self._sync_each(logs, checkpoint=False)
        results: SyncResult = [None] * len(logs)
        by_device: dict[int, list[int]] = {}
        for i, plog in enumerate(logs):
            try:
                by_device.setdefault(self._device(plog), []).append(i)
            except OSError as exc:
                results[i] = exc
        for dev, indexes in by_device.items():
            group = [logs[i] for i in indexes]
            watcher = self._watchers.get(dev)
            if watcher is None:
                # Errors from before the watcher opened would go unseen: this cycle syncs file by file.
                try:
                    self._watchers[dev] = os.open(group[0].directory, os.O_RDONLY)
                except OSError:
                    pass
                for i, outcome in zip(indexes, self._sync_each(group, checkpoint=False), strict=True):
                    results[i] = outcome
                continue
            try:
                self._syncfs(watcher)
            except OSError as exc:
                for i in indexes:
                    results[i] = exc
                continue
            for i in indexes:
                try:
                    logs[i].synced(checkpoint=False)
                except Exception as exc:
                    results[i] = exc
        return results

    def _claims_due(self, synced: Sequence[PartitionLog]) -> None:
        """After a sync (on the writer thread, or on the loop after the sync helper's; never both at
        once: cycles do not overlap): takes the due claims of ``synced`` (one per directory: a
        reloaded log replaces its predecessor) and starts a recording of every claim waiting, unless
        one is running or the last started under RECORD_SPACING_S ago. Claims left waiting go with
        the recording a later sync starts, or are superseded by the claim a closing log records."""
        for plog in synced:
            if plog.checkpoint_due():
                claim = plog.take_claim()
                if claim is not None:
                    self._due[str(plog.directory)] = (plog, claim)
        if not self._due or (self._recording is not None and not self._recording.done()):
            return
        now = time.monotonic()
        if now - self._recorded_at < RECORD_SPACING_S:
            return
        due, self._due = self._due, {}
        try:
            self._recording = self._recorder.submit(self._record, list(due.values()))
            self._recorded_at = now
        except RuntimeError:  # closed: the process is stopping, and closing shards record their own
            pass

    def _record(self, claims: list[tuple[PartitionLog, tuple[int, int]]]) -> None:
        """Recorder thread: the claims of each file system together: temporary files written, one
        syncfs, renamed into place (unless a newer claim is there by then), one syncfs; so a crash
        leaves each log with its old or new claim, both true, at the cost of two syncfs instead of
        two fsyncs per log. The descriptor is the recorder's own, opened before its files are
        written: its syncfs report their errors and leave the writer's watcher to see its own."""
        by_device: dict[int, list[tuple[PartitionLog, tuple[int, int]]]] = {}
        for plog, claim in claims:
            try:
                by_device.setdefault(self._device(plog), []).append((plog, claim))
            except OSError as exc:
                plog.checkpoint_failed(exc)
        for group in by_device.values():
            written = []
            try:
                fd = os.open(group[0][0].directory, os.O_RDONLY)
            except OSError as exc:
                for plog, _ in group:
                    plog.checkpoint_failed(exc)
                continue
            try:
                for plog, claim in group:
                    try:
                        written.append((plog, claim, plog.write_checkpoint(claim, RECORDER_TMP)))
                    except OSError as exc:
                        plog.checkpoint_failed(exc)
                if written:
                    self._syncfs(fd)
                    for plog, claim, tmp in written:
                        plog.install_checkpoint(tmp, taken=claim)
                    self._syncfs(fd)
            except OSError as exc:  # the data is durable; only the claims may be old, which is still true
                for plog, _, _ in written:
                    plog.checkpoint_failed(exc)
            finally:
                os.close(fd)

    def wait_recorded(self, timeout: float | None = None) -> bool:
        """Waits for the running recording, if any (for tests and tools); True if one ran."""
        if self._recording is None:
            return False
        self._recording.result(timeout)
        return True

    def _device(self, plog: PartitionLog) -> int:
        # From the writer and the recorder threads: a lost race only stats the directory twice.
        key = str(plog.directory)
        dev = self._devices.get(key)
        if dev is None:
            dev = self._devices[key] = os.stat(plog.directory).st_dev
        return dev

    def close(self) -> None:
        super().close()
        self._recorder.shutdown(wait=False, cancel_futures=True)
        for fd in self._watchers.values():
            os.close(fd)
        self._watchers.clear()


def _fsync_plan(plog: PartitionLog) -> tuple[int, int] | None:
    fd = plog.sync_fd()
    return None if fd is None else (OP_FSYNC, fd)


def _synced(plog: PartitionLog, end: LogEnd) -> BaseException | None:
    try:
        plog.synced(checkpoint=False, upto=end)
    except Exception as exc:
        return exc
    return None


def _sync_one(plog: PartitionLog, checkpoint: bool) -> BaseException | None:
    try:
        plog.sync(checkpoint)
    except Exception as exc:
        return exc
    return None


def make_sync(mode: str) -> FileSync:
    """``syncfs`` (one syncfs per file system per cycle, where the kernel reports errors through it,
    else per file) or ``fsync`` (always per file)."""
    if mode in ("syncfs", "journal") and SYNCFS is not None:  # journal: coordinator.runtime replaces it
        return FilesystemSync(SYNCFS)
    return FileSync()
