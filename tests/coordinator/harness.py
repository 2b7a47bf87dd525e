"""Helpers to drive a real Runtime (real files, real threads) from tests: writes through the shard's
``write`` operation as a request would, and a partition log that injects faults through the log-factory
seam (fail the next fsync, tear the next append, a disk that is full until told otherwise)."""

import asyncio
import errno
import threading
from pathlib import Path
from typing import Any

from coordinator.apis import k08_offset_commit as k08
from coordinator.config import Config
from coordinator.request import Api, Request
from coordinator.runtime import LogFactory, Runtime
from coordinator.shard import OpResult, Shard
from coordinator.shardstate import ShardState
from coordinator.state import ShardData, offset_value
from protocol.errors import ErrorCode
from protocol.records import LiveRecord, OffsetAndMetadata, OffsetCommitRecord, OffsetKey
from storage.journal import Journal, JournalSegment
from storage.log import LogEnd, PartitionLog

OK = "ok"


def config(data_dir: Path, partitions: int = 1, **kw: Any) -> Config:
    """``syncfs`` unless asked: these tests inject faults into each partition log's own sync, which the
    journal mode (the server's default) does behind the journal (tests/coordinator/test_journal_mode.py
    injects its faults into the journal)."""
    kw.setdefault("sync_mode", "syncfs")
    return Config(data_dir=data_dir, offsets_partitions=partitions, **kw)


def on_disk(directory: Path) -> list[int]:
    """The offsets a partition log's directory holds, as a recovery reads them back."""
    return [r.offset for b in PartitionLog(directory).recover() for r in b.records]


async def started(cfg: Config, log_factory: LogFactory = PartitionLog, **kw: Any) -> Runtime:
    runtime = Runtime(cfg, log_factory=log_factory, **kw)
    runtime.start()
    await runtime.wait_loaded()
    return runtime


async def stop(runtime: Runtime) -> None:
    await runtime.stop(asyncio.get_running_loop().time() + 10)


def commit(group: str, partition: int, offset: int) -> OffsetCommitRecord:
    return OffsetCommitRecord(OffsetKey(group, "t", partition), OffsetAndMetadata(offset, -1, "m", 1))


def _bare_error(body: Any, version: int, error: ErrorCode) -> Any:
    return error


def _not_called(*args: Any) -> Any:
    raise AssertionError("a stand-in API's handler, decoder or encoder was called")


def stand_in_api() -> Api:
    """Stands in for an API module (OffsetCommit's spec, for its name): a failed write answers with
    the bare error code."""
    return Api(k08.SPEC, _not_called, _bare_error, None, None,
               lambda response: (0, 0), None, _not_called)


class Holds:
    """A connection stand-in's count of the shard's holds on starting its next request (a huge write
    being applied: coordinator.request.ReplySink)."""

    held = 0
    aborted: str | None = None

    def hold(self) -> None:
        self.held += 1

    def unhold(self) -> None:
        self.held -= 1

    def abort(self, why: str, reason: str = "other") -> None:
        self.aborted = reason

    def forget(self, request: Request) -> bool:
        return False  # as a connection with later requests behind this one


class FutureSink(Holds):
    """A connection stand-in: the reply's release resolves a future with the response."""

    def __init__(self) -> None:
        self.future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def reply_ready(self, request: Request) -> None:
        self.future.set_result(request.response)


def _records_op(data: ShardData, records: list[LiveRecord]) -> OpResult:
    return OpResult(records, OK)


def append(shard: Shard, records: list[LiveRecord], sink: FutureSink | None = None) -> "asyncio.Future[Any]":
    """Writes ``records`` as a request would; the future gives OK once durable, else the error code."""
    sink = sink or FutureSink()
    req = Request(sink, stand_in_api(), 0, 0)
    req.wait()  # as the server does around a handler
    req.response = shard.write(req, _records_op, records)
    req.done()
    return sink.future


async def wait_state(shard: Shard, *states: ShardState, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while shard.state not in states:
        assert asyncio.get_running_loop().time() < deadline, f"shard stuck in {shard.state}, wanted {states}"
        await asyncio.sleep(0.005)


class Faults:
    """Fault switches shared by every log a shard opens (it reopens its log after a failure):
    fail the next append or fsync, or a full disk (appends write part of the batch, then ENOSPC;
    the writability probe fails)."""

    def __init__(self) -> None:
        self.fail_next_sync = False
        self.fail_next_append = False
        self.disk_full = False
        self.read_only = False  # EROFS on every write: truncation and the probe included
        # While set, a sync stops (after its fsyncs) until the event is set: holds the writer thread
        # (run with sync_helper=False: after the sync helper's fsyncs it would hold the event loop).
        self.hold_sync: threading.Event | None = None
        self.sync_held = threading.Event()  # a sync is being held
        self.fail_next_checkpoint = False  # journal mode only (FaultyJournal): a checkpoint's step
        self.fail_next_journal_write = False  # journal mode only: ENOSPC writing the journal
        self.probes = 0  # writability probes made (FaultyLog.probe)

    def factory(self, directory: Path, segment_bytes: int) -> PartitionLog:
        return FaultyLog(directory, segment_bytes, self)

    def journal(self, data_dir: Path) -> Journal:
        return FaultyJournal(data_dir, self)

    def at_sync(self, message: str) -> None:
        """Where a sync returns: held while ``hold_sync`` is set, then failed if ``fail_next_sync``."""
        hold = self.hold_sync
        if hold is not None:
            self.sync_held.set()
            hold.wait(10)
        if self.fail_next_sync:
            self.fail_next_sync = False
            raise OSError(errno.EIO, message)


class FaultyLog(PartitionLog):
    def __init__(self, directory: Path, segment_bytes: int, faults: Faults) -> None:
        super().__init__(directory, segment_bytes)
        self.faults = faults

    def append(self, batch: bytes, last_offset: int) -> None:
        faults = self.faults
        if faults.fail_next_append:
            faults.fail_next_append = False
            raise OSError(errno.EIO, "injected EIO in append")
        if faults.disk_full:
            super().append(batch[: len(batch) // 2], last_offset)  # a short write, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        super().append(batch, last_offset)

    def truncate_to_durable(self) -> None:
        if self.faults.read_only:
            raise OSError(errno.EROFS, "Read-only file system (injected)", str(self.directory))
        super().truncate_to_durable()

    def synced(self, checkpoint: bool = True, upto: LogEnd | None = None) -> None:
        # Called once the log's fsyncs (or its file system's syncfs) returned: failing here is an
        # fsync failure in either sync mode, before the durable end moves.
        self.faults.at_sync("injected EIO in fsync")
        super().synced(checkpoint, upto)

    def probe(self) -> None:
        self.faults.probes += 1
        if self.faults.read_only:
            raise OSError(errno.EROFS, "Read-only file system (injected)", str(self.directory))
        if self.faults.disk_full:
            raise OSError(errno.ENOSPC, "No space left on device (injected)", str(self.directory))
        super().probe()


def offsets_of(data: ShardData) -> dict[str, dict[tuple[str, int], OffsetAndMetadata]]:
    """The cached offsets as OffsetAndMetadata, whether cached by a live commit or as loaded bytes."""
    return {g: {tp: offset_value(v) for tp, v in group.items()} for g, group in data.offsets.items()}


def pending_of(data: ShardData) -> dict[int, dict[OffsetKey, tuple[int, OffsetAndMetadata]]]:
    """The open transactions' offsets, read the same way."""
    return {pid: {k: (at, offset_value(v)) for k, (at, v) in offs.items()} for pid, offs in data.pending.items()}


class FaultyJournal(Journal):
    """The journal with the same switches (``--sync-mode journal``): ``fail_next_sync`` fails its next
    sync (run with sync_helper=False: the writer thread makes it), ``fail_next_journal_write`` its next
    write (ENOSPC), and ``fail_next_checkpoint`` the next checkpoint's step on its thread."""

    def __init__(self, data_dir: Path, faults: Faults) -> None:
        super().__init__(data_dir)
        self.faults = faults

    def write(self) -> tuple[JournalSegment, int]:
        if self.faults.fail_next_journal_write:
            self.faults.fail_next_journal_write = False
            self.live.broken = True
            raise OSError(errno.ENOSPC, "No space left on device (injected in the journal)")
        return super().write()

    def sync(self, seg: JournalSegment) -> None:
        self.faults.at_sync("injected EIO in the journal's fdatasync")
        super().sync(seg)

    def drop(self, paths: list[Path]) -> bool:
        """The checkpoint's step after its syncfs, whether or not it deletes anything."""
        self._checkpoint_step()
        return super().drop(paths)

    def delete(self, paths: list[Path]) -> None:
        self._checkpoint_step()
        super().delete(paths)

    def _checkpoint_step(self) -> None:
        if self.faults.fail_next_checkpoint:
            self.faults.fail_next_checkpoint = False
            raise OSError(errno.EIO, "injected EIO in a checkpoint")
