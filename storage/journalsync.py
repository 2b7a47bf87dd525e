"""Flush cycles made durable by the journal (storage.journal), and the checkpoints behind them.

The flusher (coordinator.flusher) drives this as it drives storage.sync: ``prepare`` on the event loop
when a cycle is posted (the journal write: every batch appended to a log since the last one, the cycle's
and any appended ahead), then the one system call ``plan`` names (an fdatasync of the journal, on the
sync helper) or ``sync`` on the writer thread (a journal segment just created also needs its directory
entry synced), and ``planned_done`` / ``settle`` on the loop with the outcome. A log counts durable up
to its end when the cycle was posted (``PartitionLog.journaled``); its own bytes are synced by the next
checkpoint (``checkpoint_sync``, run by coordinator.checkpointer off the commit path), which also
records the logs' recovery points as storage.sync's recorder does.
"""

import os
from collections.abc import Callable, Sequence

from storage.journal import Journal, JournalSegment
from storage.log import LogEnd, PartitionLog
from storage.sync import Claims, FilesystemSync, SyncResult
from storage.synchelper import OP_FDATASYNC


class _NotRun(Exception):
    """The writer thread never got to the cycle's sync."""


class JournalSync(FilesystemSync):
    def __init__(self, journal: Journal, syncfs: Callable[[int], None]) -> None:
        super().__init__(syncfs)
        self.journal = journal
        self._posted: tuple[JournalSegment, int] | None = None  # the journal segment a cycle syncs, and how far
        self._ends: Sequence[LogEnd] = ()
        self._outcome: BaseException | None = None  # the writer thread's, for ``settle``
        self._watcher = -1

    def prepare(self, logs: Sequence[PartitionLog], ends: Sequence[LogEnd]) -> None:
        """On the loop, as a cycle is posted: writes the journal (raises OSError if that fails: the
        cycle fails, and so does every shard that appended ahead, whose batches went with it)."""
        self._ends = ends
        seg, size = self.journal.write()
        self.journal.in_flight = seg
        self._posted = (seg, size)
        self._outcome = _NotRun()

    def plan(self, logs: Sequence[PartitionLog]) -> tuple[int, int] | None:
        if self._posted is None:
            return None
        fd = self.journal.plan(self._posted[0])
        return None if fd is None else (OP_FDATASYNC, fd)

    def planned_done(self, logs: Sequence[PartitionLog], error: BaseException | None,
                     ends: Sequence[LogEnd]) -> SyncResult:
        self._outcome = error
        self.settle()
        if error is not None:
            return [error] * len(logs)
        return [_journaled(plog, end) for plog, end in zip(logs, ends, strict=True)]

    def sync(self, logs: Sequence[PartitionLog]) -> SyncResult:
        """Writer thread: the journal segment's fdatasync, and its directory's when it is new."""
        if self._posted is None:
            return [RuntimeError("no journal write was prepared for this cycle")] * len(logs)
        try:
            self.journal.sync(self._posted[0])
        except OSError as exc:
            self._outcome = exc
            return [exc] * len(logs)
        self._outcome = None
        return [_journaled(plog, end) for plog, end in zip(logs, self._ends, strict=True)]

    def settle(self, error: BaseException | None = None) -> None:
        """On the loop, once the cycle's sync is over (or known never to happen): the journal segment
        durable that far, or never written again after a failure."""
        if self._posted is None:
            return
        seg, size = self._posted
        self._posted = None
        self.journal.synced(seg, size, error if error is not None else self._outcome)

    # -- checkpoints ---------------------------------------------------------------------------------

    def checkpoint_sync(self) -> None:
        """Checkpoint thread: one syncfs of the data directory's file system, through a descriptor
        kept open for it (syncfs reports a writeback error once per descriptor: this one sees every
        error in the logs since the checkpoints began). Raises OSError."""
        if self._watcher < 0:
            self._watcher = os.open(self.journal.directory, os.O_RDONLY)
        self._syncfs(self._watcher)

    def record(self, claims: Claims) -> None:
        """Checkpoint thread: the logs' recovery points, as storage.sync's recorder records them."""
        if claims:
            self._record(list(claims.values()))

    def close(self) -> None:
        super().close()
        if self._watcher >= 0:
            os.close(self._watcher)
            self._watcher = -1


def _journaled(plog: PartitionLog, end: LogEnd) -> BaseException | None:
    try:
        plog.journaled(end)
    except Exception as exc:
        return exc
    return None
