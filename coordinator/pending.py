"""A shard's records on their way to disk (coordinator.shard): the open batch that requests join and
wait on, and the batch a flush cycle has taken. Compiled with the shard (setup.py)."""

from collections.abc import Callable
from typing import Final

from coordinator.request import Fixup, Request
from protocol.errors import ErrorCode
from storage.batchwriter import Entry, build_batches
from storage.log import PartitionLog

MAX_BATCH_BYTES: Final = 1024 * 1024  # Kafka's max.message.bytes for the offsets topic, about 1 MiB


class Batch:
    """Encoded records, and the requests and callbacks waiting for them to be durable. The records may
    go into the log in several appends (the flusher's appends ahead of the batch's cycle, then the
    cycle's own): ``written`` counts those appended so far."""

    __slots__ = ("callbacks", "entries", "error", "nbytes", "waiters", "written")

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.waiters: list[tuple[Request, Fixup | None]] = []
        self.callbacks: list[Callable[[], None]] = []
        self.written = 0  # entries appended to the log so far
        self.nbytes = 0  # their bytes
        self.error: BaseException | None = None  # an append ahead failed: the batch's cycle fails it

    def fail(self, error: ErrorCode) -> None:
        for req, fixup in self.waiters:
            req.done(fixup, error)
        self.waiters.clear()
        self.callbacks.clear()

    def append_to(self, plog: PartitionLog, base: int, timestamp: int, ahead: bool) -> None:
        """Appends the entries not yet written (entry 0 at offset ``base``) as record batches of at most
        ~1 MiB. ``ahead`` (a sync of ``plog`` may be under way): stops before a new segment, whose
        directory entry that sync would not cover."""
        if self.written == len(self.entries):  # all appended ahead (most cycles at a steady, paced load)
            return
        base += self.written
        entries = self.entries[self.written:] if self.written else self.entries
        for data, count in build_batches(base, entries, timestamp, MAX_BATCH_BYTES):
            if ahead and not plog.fits(len(data)):
                return
            plog.append(data, base + count - 1)
            base += count
            self.written += count
            self.nbytes += len(data)


class Flush:
    """A batch handed to the flusher, with the offset of its first record and its timestamp. A plain
    class: compiled, a NamedTuple's constructor is an interpreted frame."""

    __slots__ = ("base", "batch", "timestamp")

    def __init__(self, batch: Batch, base: int, timestamp: int) -> None:
        self.batch = batch
        self.base = base
        self.timestamp = timestamp
