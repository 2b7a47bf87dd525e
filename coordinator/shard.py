"""The runtime of one ``__consumer_offsets`` partition: its operations and its write path, on its lifecycle
(loading, fail-stop recovery, the read-only probe: coordinator.shardlifecycle).

Operations (Kafka's ``CoordinatorRuntime`` shape): ``write(req, op, *args)`` runs a pure op against the
state; the op returns records and a response; the records get the next log offsets and are replayed at
once (the next op sees them) and join the *open* batch; the request waits on that batch. The flusher
(coordinator/flusher.py) takes the open batches of every shard with one (coordinator/pending.py),
appends each as Kafka v2 record batches (or what the batch has not appended ahead while an earlier
cycle synced) and makes them durable together; then every request waiting on them is released.
``read(req, fixup, op, *args)`` runs an op that writes nothing; it still waits for the newest pending
batch, so no client sees state a failed fsync could take back.
Timers are keyed per shard and their expiry runs an op through ``write``.

Fail-stop: if an append or fsync fails, every waiting request fails (NOT_COORDINATOR), the bytes this
process appended past the durable end are dropped, and the shard reloads (coordinator.shardlifecycle) with
the same ``replay`` the loader always uses. No rollback logic. If the disk is still not writable (full, read-only, no
permission) the shard comes back READ_ONLY: acknowledged offsets stay readable while writes get a
retriable error, and a probe finds out within seconds when writing works again.
"""

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, Final, NamedTuple

from coordinator.flusher import Flusher, FlushOutcome
from coordinator.logfmt import Repeated, describe_error
from coordinator.metrics import Metrics
from coordinator.pending import Batch, Flush
from coordinator.request import Fixup, Request, ShardUnavailable
from coordinator.shardlifecycle import REPEAT_LOG_S, ShardHooks, ShardLifecycle
from coordinator.shardstate import READ_ERRORS, WRITE_ERRORS, ShardState
from coordinator.timers import Clock
from protocol.errors import ErrorCode
from protocol.records import LiveRecord, encode_record
from storage.batchwriter import Entry
from storage.log import PartitionLog

log = logging.getLogger(__name__)

APPEND_SLICE: Final = 1024  # records replayed per loop pass for a huge operation (~1 ms)
# A huge operation's next slice waits while this many of the shard's records are not yet durable: the
# loop replays faster than the writer appends, and unbounded, one flush cycle would take on tens of
# thousands of records (~130 ms measured) that every other partition's commit then waits behind.
SLICES_AHEAD: Final = 2 * APPEND_SLICE

# Enum members as C variables, not class attributes (tests/protocol/test_compiled.py says why).
_ERR_NOT_COORDINATOR: Final = ErrorCode.NOT_COORDINATOR
_ERR_UNKNOWN_SERVER_ERROR: Final = ErrorCode.UNKNOWN_SERVER_ERROR
_SHARD_ACTIVE: Final = ShardState.ACTIVE
_SHARD_CLOSED: Final = ShardState.CLOSED
_SHARD_FAILED: Final = ShardState.FAILED
_SHARD_READ_ONLY: Final = ShardState.READ_ONLY


class OpResult(NamedTuple):
    """What an operation returns: records to append, the response, a fix-up for the response if the
    records do not become durable, a callback once they are, (for large requests prepared off the
    event loop) the records already encoded, and whether the records are replayed (Kafka's
    ``replayRecords``: classic-group metadata written at a generation boundary is not; loading does)."""

    records: list[LiveRecord]
    response: Any
    fixup: Fixup | None = None
    on_durable: Callable[[], None] | None = None
    encoded: list[Entry] | None = None
    replay: bool = True  # False: the op already changed the state these records persist (group metadata)


class Shard(ShardLifecycle):
    """One partition's operations and write path, on its lifecycle (coordinator.shardlifecycle)."""

    def __init__(
        self,
        partition: int,
        partition_log: PartitionLog,
        writer: Executor,
        flusher: Flusher,
        loader: Executor,
        metrics: Metrics,
        clock: Clock,
        hooks: ShardHooks | None = None,
        log_factory: "Callable[[Path, int], PartitionLog] | None" = None,
    ) -> None:
        super().__init__(partition, partition_log, writer, loader, metrics, clock, hooks, log_factory)
        self.flusher = flusher
        self._open: Batch | None = None
        self._parked: list[Callable[[], None]] = []  # huge operations' next slices, waiting for the writer
        # A disk that stays full makes a partition fail, reload read-only, find room and fail again every
        # few seconds: each of its two ERROR lines once, then once a minute, until a flush succeeds.
        self._failed_writes = Repeated(log, REPEAT_LOG_S)

    # -- operations ----------------------------------------------------------------------------

    def write(self, req: Request | None, op: Callable[..., OpResult], *args: Any) -> Any:
        """Runs ``op(self.data, *args)``; its records are replayed and appended, and ``req`` waits until
        they (or, with no records, all earlier writes) are durable. Raises ShardUnavailable unless ACTIVE."""
        self.writable()
        return self.write_result(req, op(self.data, *args))

    def writable(self) -> None:
        """``write``'s first half, for a caller that runs its operation on ``data`` itself (OffsetCommit:
        a compiled call, where ``op(self.data, *args)`` is one through the interpreter's protocol, ~2,800
        instructions of a 1-partition commit): raises ShardUnavailable unless ACTIVE."""
        if self.state is not _SHARD_ACTIVE:
            raise ShardUnavailable(WRITE_ERRORS[self.state])

    def write_result(self, req: Request | None, result: OpResult) -> Any:
        """``write``'s second half: the operation's records replayed and appended, ``req`` waiting for them."""
        batch: Batch | None
        if len(result.records) > APPEND_SLICE:
            if self._closing:  # its slices would be refused: refused whole, through the handler's caller
                raise ShardUnavailable(_ERR_NOT_COORDINATOR)
            self._append_sliced(req, result, 0)
            return result.response
        if result.records:
            batch = self._append(result.records, result.encoded, result.replay)
            if result.on_durable is not None:
                batch.callbacks.append(result.on_durable)
        else:
            batch = self._open or self._inflight
            if result.on_durable is not None:
                if batch is None:
                    result.on_durable()
                else:
                    batch.callbacks.append(result.on_durable)
        if req is not None and batch is not None:
            req.wait()
            batch.waiters.append((req, result.fixup))
        return result.response

    def _append_sliced(self, req: Request | None, result: OpResult, start: int) -> None:
        """Appends a huge result APPEND_SLICE records per loop pass, so replaying it never holds the event
        loop for long. Other clients' operations may interleave (the log order is still the replay
        order), not the same client's: its connection is held until the last slice is replayed. The
        request waits on the last slice's batch; if the shard stops serving first, it gets
        NOT_COORDINATOR for all it wrote (some may be durable: a retry is harmless); if a later slice
        fails unexpectedly (a bug), UNKNOWN_SERVER_ERROR, rather than no answer."""
        sink = req.sink if req is not None else None
        if start == 0 and req is not None:
            req.wait()
            if sink is not None:
                sink.hold()
        try:
            over = self._append_slice(req, result, start)
        except Exception:
            if start == 0:  # raised to the handler's caller, which answers for it (the server: it closes)
                if sink is not None:
                    sink.unhold()
                raise
            log.exception("partition %d: a slice of a huge operation failed", self.partition)
            if req is not None:
                req.done(result.fixup, _ERR_UNKNOWN_SERVER_ERROR)
            over = True
        if over and sink is not None:
            sink.unhold()

    def _append_slice(self, req: Request | None, result: OpResult, start: int) -> bool:
        """One slice; True once the operation is over (its last slice appended, or refused)."""
        if self.state is not _SHARD_ACTIVE or self._closing:
            if req is not None:
                req.done(result.fixup, _ERR_NOT_COORDINATOR)
            return True
        end = start + APPEND_SLICE
        encoded = result.encoded[start:end] if result.encoded is not None else None
        batch = self._append(result.records[start:end], encoded)
        if end < len(result.records):
            if self._pending_records() >= SLICES_AHEAD:
                self._parked.append(lambda: self._append_sliced(req, result, end))
            else:
                asyncio.get_running_loop().call_soon(self._append_sliced, req, result, end)
            return False
        if result.on_durable is not None:
            batch.callbacks.append(result.on_durable)
        if req is not None:
            batch.waiters.append((req, result.fixup))
        return True

    def read(self, req: Request | None, fixup: Fixup | None, op: Callable[..., Any], *args: Any) -> Any:
        """Runs ``op(self.data, *args)`` for its response; ``req`` waits for the newest pending write, if
        any (``fixup`` turns its part of the response into an error should that write fail)."""
        self.readable()
        response = op(self.data, *args)
        self.read_done(req, fixup)
        return response

    def readable(self) -> None:
        """``read``'s first half, for a caller that reads ``data`` itself (OffsetFetch: a compiled call
        to its reader, where ``op(self.data, *args)`` is a call through the interpreter's protocol,
        ~2,500 instructions of a 1-partition fetch): raises ShardUnavailable unless reads are served."""
        state = self.state  # an Enum hashes in Python: look it up only when not plainly ACTIVE
        if state is not _SHARD_ACTIVE and (error := READ_ERRORS.get(state)) is not None:
            raise ShardUnavailable(error)

    def read_done(self, req: Request | None, fixup: Fixup | None) -> None:
        """``read``'s second half, once ``data`` was read: ``req`` waits for the newest pending write."""
        batch = self._open or self._inflight
        if req is not None and batch is not None:
            req.wait()
            batch.waiters.append((req, fixup))

    def schedule(self, key: str, delay_ms: int, op: Callable[..., OpResult], *args: Any) -> None:
        """A keyed timer whose expiry runs ``op`` through ``write`` (dropped if the shard stopped serving)."""
        self.timers.schedule(key, delay_ms, self._timer_op, op, args)

    def _timer_op(self, op: Callable[..., OpResult], args: tuple[Any, ...]) -> None:
        try:
            self.write(None, op, *args)
        except ShardUnavailable:
            pass
        except Exception:
            log.exception("partition %d: timer operation %s failed", self.partition, getattr(op, "__name__", op))

    # -- write path ----------------------------------------------------------------------------

    def _pending_records(self) -> int:
        """Records replayed but not yet durable."""
        return sum(len(batch.entries) for batch in (self._open, self._inflight) if batch is not None)

    def _resume_parked(self) -> None:
        """Lets parked slices go on (each parks again if the writer is still behind)."""
        parked, self._parked = self._parked, []
        loop = asyncio.get_running_loop()
        for resume in parked:
            loop.call_soon(resume)

    def _append(self, records: list[LiveRecord], encoded: list[Entry] | None, replay: bool = True) -> Batch:
        """Encodes first (a record that cannot be encoded fails only its own request), then replays at
        the next offsets and adds to the open batch, scheduling a flush if none is running."""
        if encoded is None:
            encoded = [encode_record(r) for r in records]
        if replay:
            self.data.replay_records(self._next_offset, records)
        self._next_offset += len(records)
        batch = self._open
        if batch is None:
            batch = Batch()
            self._open = batch
            self.flusher.request(self)
        batch.entries.extend(encoded)
        return batch

    def take_batch(self) -> "Flush | None":
        """Flusher, on the loop: the open batch becomes the one in flight, unless one already is (its
        completion asks again) or the shard stopped serving writes."""
        batch = self._open
        if self._inflight is not None or batch is None or self.state is not _SHARD_ACTIVE:
            return None
        self._open, self._inflight = None, batch
        return Flush(batch, self._next_offset - len(batch.entries), self.clock.now_ms())

    def append_batch(self, work: "Flush") -> int:
        """Flusher, on the loop: what the batch has not appended ahead, as record batches of at most
        ~1 MiB; returns the batch's bytes. Not durable until the flusher's sync of the log is back."""
        batch = work.batch
        if batch.error is not None:
            raise batch.error
        batch.append_to(self.log, work.base, work.timestamp, ahead=False)
        return batch.nbytes

    def write_ahead(self) -> None:
        """Flusher, on the loop, while the sync helper syncs an earlier cycle: appends the open batch's
        new records to the page cache now, so its own cycle only has to sync them. Never a new
        segment (the sync in flight would not cover its directory entry): that is left to the cycle.
        A failure is kept for the cycle, which fails the batch as if its append had failed there."""
        batch = self._open
        if batch is None or batch.error is not None or self.state is not _SHARD_ACTIVE \
                or batch.written == len(batch.entries):
            return
        try:
            batch.append_to(self.log, self._next_offset - len(batch.entries), self.clock.now_ms(), ahead=True)
        except Exception as exc:
            batch.error = exc

    @property
    def written_ahead(self) -> bool:
        """The open batch has bytes in the log that no sync has covered yet."""
        return self._open is not None and self._open.written > 0

    def synced(self, work: "Flush") -> None:
        """Flusher, on the loop: the batch in flight is durable. The open one may join the next cycle,
        which starts before ``flushed`` releases this batch's requests."""
        self._inflight = None
        if self._open is not None:
            self.flusher.request(self)

    def flushed(self, work: "Flush", started: float, outcome: FlushOutcome) -> None:
        """Flusher, on the loop, after ``synced``: the batch is durable (release its requests); or, on
        its own, failed (fail them, reload)."""
        batch = work.batch
        if isinstance(outcome, BaseException):
            self._inflight = None
            batch.fail(_ERR_NOT_COORDINATOR)
            self.fail_write(outcome)
            return
        for callback in batch.callbacks:
            try:
                callback()
            except Exception:
                log.exception("partition %d: on-durable callback failed", self.partition)
        for req, _ in batch.waiters:
            req.done()
        self._metrics.batch_flushed(self.partition, len(batch.entries), outcome, time.perf_counter() - started)
        if self._write_failed:
            self._write_failed = False
            self._failed_writes.reset()
            self._unwritable.reset()
            self.wake_cleaner()
        if self._parked and self._pending_records() < SLICES_AHEAD:
            self._resume_parked()

    def _fail_pending(self, error: ErrorCode) -> None:
        for batch in (self._inflight, self._open):
            if batch is not None:
                batch.fail(error)
        self._open = None
        self._resume_parked()  # they find the shard no longer serving and answer their requests

    def fail_write(self, exc: BaseException) -> None:
        self.log.refused = True  # its batches not yet journaled are never acknowledged: keep them out
        self._write_failed = True
        self.wake_cleaner()  # a full disk, likely
        self._failed_writes.report(logging.ERROR, "partition %d: write failed (%s); failing the requests waiting on "
                                   "it, dropping what was not durable and reloading", self.partition,
                                   describe_error(exc))
        self._metrics.write_failed(self.partition)
        if not self._transition(_SHARD_FAILED):
            self._fail_pending(_ERR_NOT_COORDINATOR)
            return
        self._fail_pending(_ERR_NOT_COORDINATOR)
        if not self._closing and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._recover())

    # -- shutdown ------------------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        return self._open is None and self._inflight is None

    async def close(self, deadline: float) -> bool:
        """Lets pending batches become durable (their requests are then answered) until ``deadline``
        (event-loop time), then closes: anything still pending is answered NOT_COORDINATOR. False if
        a write was still stuck in its thread (the process should not wait for it at exit)."""
        self._closing = True
        loop = asyncio.get_running_loop()
        while self.state is _SHARD_ACTIVE and not self.idle and loop.time() < deadline:
            await asyncio.sleep(0.005)
        clean = self.idle and self.state in (_SHARD_ACTIVE, _SHARD_READ_ONLY)
        stuck = self._inflight is not None
        self._transition(_SHARD_CLOSED)
        self._fail_pending(_ERR_NOT_COORDINATOR)
        self.timers.cancel_all()
        if stuck:
            log.warning("partition %d: a write was still running at the shutdown deadline", self.partition)
            return False
        remaining = max(deadline - loop.time(), 0.1)
        try:
            await asyncio.wait_for(loop.run_in_executor(self.writer, self._close_log, clean), remaining)
        except TimeoutError:
            log.warning("partition %d: closing its log did not finish by the deadline", self.partition)
            return False
        except OSError as exc:
            log.warning("partition %d: closing its log failed: %s", self.partition, describe_error(exc))
        return True

    def _close_log(self, checkpoint: bool) -> None:
        if checkpoint and self.log.recovered:
            if self.log.journal is not None:  # durable in the journal, maybe not yet in the log itself
                self.log.sync(checkpoint=False)
            self.log.checkpoint()  # a clean stop: everything on disk is known durable
        self.log.close()

