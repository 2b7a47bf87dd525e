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
"""

import ctypes
import ctypes.util
import os
import platform
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from storage.log import PartitionLog

SyncResult = list[BaseException | None]  # per log, in order: None when it is durable


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

    def sync(self, logs: Sequence[PartitionLog]) -> SyncResult:
        if len(logs) == 1:
            return [_sync_one(logs[0])]
        return list(self._pool.map(_sync_one, logs))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


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
            self._checkpoint([logs[i] for i in indexes if results[i] is None], watcher)
        return results

    def _checkpoint(self, synced: list[PartitionLog], watcher: int) -> None:
        """The recovery points that are due, recorded together: temporary files written, one syncfs,
        renamed into place, one syncfs; so a crash leaves each log with its old or new claim, both
        true, at the cost of two syncfs instead of two fsyncs per log."""
        written = []
        for plog in synced:
            if plog.checkpoint_due():
                try:
                    written.append((plog, plog.write_checkpoint()))
                except OSError as exc:
                    plog.checkpoint_failed(exc)
        if not written:
            return
        try:
            self._syncfs(watcher)
            for plog, tmp in written:
                plog.install_checkpoint(tmp)
            self._syncfs(watcher)
        except OSError as exc:  # the data is durable; only the claims may be old, which is still true
            for plog, _ in written:
                plog.checkpoint_failed(exc)

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
        plog.sync()
    except Exception as exc:
        return exc
    return None


def make_sync(mode: str) -> FileSync:
    """``syncfs`` (one syncfs per file system per cycle, where the kernel reports errors through it,
    else per file) or ``fsync`` (always per file)."""
    if mode == "syncfs" and SYNCFS is not None:
        return FilesystemSync(SYNCFS)
    return FileSync()
