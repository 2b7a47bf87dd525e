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

Recovery points (storage.log) are recorded off the commit path, by a recorder thread of their own:
recording a claim takes a temporary file, a rename and two flushes, and done inside a cycle it held
that cycle's commits for 1.4-20 ms (measured: ~22 such cycles a second at 4,200 commits/s over 44
partitions, the whole p99 of a paced load). The writer thread only takes the due claims of the logs
it has just made durable (a claim taken then stays true: durable bytes are never cut) and hands them
over; the recorder flushes with descriptors of its own, so it never consumes a writeback error that
the writer's ``syncfs`` must report, and writes its temporary files under a name nobody else uses.
A claim the recorder has not installed when the process dies is simply an older claim on disk.
"""

import ctypes
import ctypes.util
import os
import platform
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from storage.log import RECOVERY_POINT, PartitionLog, fsync_path

SyncResult = list[BaseException | None]  # per log, in order: None when it is durable
Claims = dict[PartitionLog, tuple[int, int]]
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


SYNCFS = _load_syncfs()


class FileSync:
    """Every log fsyncs its own files; several at once in parallel threads (the kernel may then share
    journal commits between them)."""

    def __init__(self, parallel: int = 8) -> None:
        self._pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="kcoord-fsync")
        self._recorder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kcoord-checkpoint")
        self._recording: Future[None] | None = None
        self._recorded_at = 0.0
        self._due: Claims = {}

    def sync(self, logs: Sequence[PartitionLog]) -> SyncResult:
        results = [_sync_one(logs[0])] if len(logs) == 1 else list(self._pool.map(_sync_one, logs))
        self._claims_due([plog for plog, error in zip(logs, results, strict=True) if error is None])
        return results

    def _claims_due(self, synced: Sequence[PartitionLog]) -> None:
        """Writer thread, after a sync: takes the due claims of ``synced`` and starts a recording of
        every claim waiting unless one is running or the last started under RECORD_SPACING_S ago."""
        for plog in synced:
            if plog.checkpoint_due():
                claim = plog.take_claim()
                if claim is not None:
                    self._due[plog] = claim
        if not self._due or (self._recording is not None and not self._recording.done()):
            return
        now = time.monotonic()
        if now - self._recorded_at < RECORD_SPACING_S:
            return
        due, self._due = self._due, {}
        try:
            self._recording = self._recorder.submit(self._record, due)
            self._recorded_at = now
        except RuntimeError:  # closed: the process is stopping, and closing shards record their own
            pass

    def _record(self, claims: Claims) -> None:
        """Recorder thread: each claim written, fsynced, renamed into place, its directory fsynced."""
        for plog, claim in claims.items():
            try:
                tmp = plog.write_checkpoint(claim, RECORDER_TMP)
                fsync_path(tmp)
                plog.install_checkpoint(tmp)
                fsync_path(plog.directory)
            except OSError as exc:
                plog.checkpoint_failed(exc)

    def wait_recorded(self, timeout: float | None = None) -> None:
        """Until the running recording (if any) is done: for tests and tools."""
        if self._recording is not None:
            self._recording.result(timeout)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._recorder.shutdown(wait=False, cancel_futures=True)


class FilesystemSync(FileSync):
    """One ``syncfs`` per file system for a cycle of two or more logs (see the module docstring)."""

    def __init__(self, syncfs: Callable[[int], None]) -> None:
        super().__init__()
        self._syncfs = syncfs
        self._watchers: dict[int, int] = {}  # st_dev -> a descriptor opened on that file system
        self._devices: dict[str, int] = {}  # log directory -> its st_dev

    def sync(self, logs: Sequence[PartitionLog]) -> SyncResult:
        if len(logs) < 2:
            return super().sync(logs)
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
                for i, outcome in zip(indexes, super().sync(group), strict=True):
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
        self._claims_due([plog for plog, error in zip(logs, results, strict=True) if error is None])
        return results

    def _record(self, claims: Claims) -> None:
        """Recorder thread: the claims of each file system together: temporary files written, one
        syncfs, renamed into place, one syncfs; so a crash leaves each log with its old or new claim,
        both true, at the cost of two syncfs instead of two fsyncs per log. The descriptor is the
        recorder's own, opened before its files are written, so the syncfs report their errors."""
        by_device: dict[int, Claims] = {}
        for plog, claim in claims.items():
            try:
                by_device.setdefault(os.stat(plog.directory).st_dev, {})[plog] = claim
            except OSError as exc:
                plog.checkpoint_failed(exc)
        for group in by_device.values():
            written = []
            try:
                fd = os.open(next(iter(group)).directory, os.O_RDONLY)
            except OSError as exc:
                for plog in group:
                    plog.checkpoint_failed(exc)
                continue
            try:
                for plog, claim in group.items():
                    try:
                        written.append((plog, plog.write_checkpoint(claim, RECORDER_TMP)))
                    except OSError as exc:
                        plog.checkpoint_failed(exc)
                if written:
                    self._syncfs(fd)
                    for plog, tmp in written:
                        plog.install_checkpoint(tmp)
                    self._syncfs(fd)
            except OSError as exc:  # the data is durable; only the claims may be old, which is still true
                for plog, _ in written:
                    plog.checkpoint_failed(exc)
            finally:
                os.close(fd)

    def _device(self, plog: PartitionLog) -> int:
        key = str(plog.directory)
        dev = self._devices.get(key)
        if dev is None:
            dev = self._devices[key] = os.stat(plog.directory).st_dev
        return dev

    def close(self) -> None:
        super().close()
        for fd in self._watchers.values():
            os.close(fd)
        self._watchers.clear()


def _sync_one(plog: PartitionLog) -> BaseException | None:
    try:
        plog.fsync_files()
        plog.synced(checkpoint=False)  # its claim goes to the recorder
    except Exception as exc:
        return exc
    return None


def make_sync(mode: str) -> FileSync:
    """``syncfs`` (one syncfs per file system per cycle, where the kernel reports errors through it,
    else per file) or ``fsync`` (always per file)."""
    if mode == "syncfs" and SYNCFS is not None:
        return FilesystemSync(SYNCFS)
    return FileSync()
