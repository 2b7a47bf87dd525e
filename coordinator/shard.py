"""The runtime of one ``__consumer_offsets`` partition: its lifecycle, its operations and its write path.

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
process appended past the durable end are dropped, and the shard reloads with the same ``replay`` the
loader always uses. No rollback logic. If the disk is still not writable (full, read-only, no
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

from mypy_extensions import mypyc_attr

from coordinator.flusher import Flusher, FlushOutcome
from coordinator.loader import LoadCancelled, replay_log
from coordinator.logfmt import Repeated, describe_error
from coordinator.metrics import Metrics
from coordinator.pending import Batch, Flush
from coordinator.request import Fixup, Request, ShardUnavailable
from coordinator.shardstate import ALLOWED_FROM, READ_ERRORS, WRITE_ERRORS, ShardState
from coordinator.state import ShardData
from coordinator.timers import Clock, Timers
from protocol.errors import ErrorCode
from protocol.records import LiveRecord, RecordError, encode_record
from storage.batch import BatchError
from storage.batchwriter import Entry
from storage.log import LogCorruptError, PartitionLog, TailNotCut

log = logging.getLogger(__name__)

APPEND_SLICE: Final = 1024  # records replayed per loop pass for a huge operation (~1 ms)
# A huge operation's next slice waits while this many of the shard's records are not yet durable: the
# loop replays faster than the writer appends, and unbounded, one flush cycle would take on tens of
# thousands of records (~130 ms measured) that every other partition's commit then waits behind.
SLICES_AHEAD: Final = 2 * APPEND_SLICE
RETRY_BACKOFF_S: Final = 0.5
RETRY_BACKOFF_MAX_S: Final = 30.0
PROBE_INTERVAL_S = 1.0  # how soon a READ_ONLY partition notices the disk is writable again
REPEAT_LOG_S: Final = 60.0  # a failure that persists is logged again at most this often


# Enum members as C variables, not class attributes (tests/protocol/test_compiled.py says why).
_ERR_NOT_COORDINATOR: Final = ErrorCode.NOT_COORDINATOR
_ERR_UNKNOWN_SERVER_ERROR: Final = ErrorCode.UNKNOWN_SERVER_ERROR
_SHARD_ACTIVE: Final = ShardState.ACTIVE
_SHARD_CLOSED: Final = ShardState.CLOSED
_SHARD_FAILED: Final = ShardState.FAILED
_SHARD_INITIAL: Final = ShardState.INITIAL
_SHARD_LOADING: Final = ShardState.LOADING
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


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled (setup.py); subclassed by coordinator/groups
class ShardHooks:
    """Domain code told when a shard starts serving writes (arm timers) and stops (answer parked
    requests, forget soft state). The default does nothing."""

    def on_loaded(self, shard: "Shard") -> None:
        pass

    def on_unloaded(self, shard: "Shard") -> None:
        pass


class Shard:
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
        self.partition = partition
        self.log = partition_log
        self.state = _SHARD_INITIAL
        self.data = ShardData()
        self.clock = clock
        self.timers = Timers(clock)
        self.hooks = hooks or ShardHooks()
        self.writer = writer  # the thread that syncs this log, probes it, reopens it and swaps segments
        self.flusher = flusher
        self._log_factory = log_factory or PartitionLog
        self._loader = loader
        self._metrics = metrics
        self._next_offset = 0
        self._open: Batch | None = None
        self._inflight: Batch | None = None
        self._parked: list[Callable[[], None]] = []  # huge operations' next slices, waiting for the writer
        self._closing = False
        self._task: asyncio.Task[None] | None = None  # the running reload or probe, kept referenced
        self._trouble = Repeated(log, REPEAT_LOG_S)
        self._tail_dirty = False  # READ_ONLY with an unacknowledged tail still on disk
        # The runtime's cleaner looks soon (coordinator.runtime) when a write fails, the log cannot be
        # written for want of room, or writes work again after failing: compaction gives room back
        self.wake_cleaner: Callable[[], None] = lambda: None
        self._write_failed = False  # set from a failed write until the next flush that succeeds
        # A disk that stays full makes a partition fail, reload read-only, find room and fail again every
        # few seconds: each of its two ERROR lines once, then once a minute, until a flush succeeds.
        self._failed_writes = Repeated(log, REPEAT_LOG_S)
        self._unwritable = Repeated(log, REPEAT_LOG_S)

    # -- lifecycle -----------------------------------------------------------------------------

    def _transition(self, to: ShardState) -> bool:
        """The only place the state changes: refused (False) unless ``to`` may follow the current state,
        so a close racing a reload ends CLOSED, never LOADING."""
        if self.state not in ALLOWED_FROM[to]:
            return False
        was_active = self.state is _SHARD_ACTIVE
        self.state = to
        self._metrics.shard_state(self.partition, to.value)
        try:
            if was_active:
                self.timers.cancel_all()
                self.hooks.on_unloaded(self)
            if to is _SHARD_ACTIVE:
                self.hooks.on_loaded(self)
        except Exception:  # a hook's bug must not leave requests unanswered or the shard half-changed
            log.exception("partition %d: %s hook failed", self.partition, "unload" if was_active else "load")
        return True

    @property
    def read_error(self) -> ErrorCode | None:
        """The error a read for this shard's groups gets now, or None when it can serve reads."""
        return READ_ERRORS.get(self.state)

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

    async def _recover(self) -> None:
        """Cuts what never became durable (retrying with backoff: the disk may be full or gone), then
        reloads. Only one recovery at a time: a second failure never truncates under a running one."""
        loop = asyncio.get_running_loop()
        # A failure from outside the flush cycle (a compaction swap) can come while a cycle still syncs
        # this log. The sync helper's answer is handled on the loop and marks the log durable up to
        # its size then: cutting the tail before that answer could let it claim bytes since cut.
        while self._inflight is not None and not self._closing:
            await asyncio.sleep(0.005)
        delay = RETRY_BACKOFF_S
        trouble = Repeated(log, REPEAT_LOG_S)
        while not self._closing:
            try:
                await loop.run_in_executor(self.writer, self._reopen_log)
                break
            except OSError as exc:
                if self.log.recovered:
                    # Its durable end is known: serve that much read-only until the tail can be cut.
                    log.error("partition %d: cannot cut its log back to the durable end (%s); serving what is "
                              "durable, read-only, until it can", self.partition, describe_error(exc))
                    await self._load(durable_only=True)
                    return
                trouble.report(logging.ERROR, "partition %d: cannot reopen its log (%s); retrying in %.1f s, backing "
                               "off to every 30 s", self.partition, describe_error(exc), delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_BACKOFF_MAX_S)
        else:
            return
        await self._load()

    def _reopen_log(self) -> None:
        """Writer thread: drop what never became durable, then reopen the directory so whatever an
        interrupted compaction left is finished or discarded."""
        if self.log.recovered:
            self.log.truncate_to_durable()
        self.log.close()
        self.log = self._log_factory(self.log.directory, self.log.segment_bytes)

    # -- loading -------------------------------------------------------------------------------

    def start(self) -> "asyncio.Task[None]":
        """Starts loading (INITIAL -> LOADING); the task ends once the shard serves or failed."""
        self._task = asyncio.get_running_loop().create_task(self._load())
        return self._task

    async def _load(self, durable_only: bool = False) -> None:
        """Replays the whole log (in the loader pool) into fresh state, then serves it: ACTIVE if the
        log can be written, READ_ONLY otherwise. An I/O error retries with backoff; corruption stays
        FAILED and says so. ``durable_only``: replay only up to the durable end, touching nothing on
        disk, and serve it READ_ONLY (the tail past it could not be cut)."""
        loop = asyncio.get_running_loop()
        delay = RETRY_BACKOFF_S
        while self._transition(_SHARD_LOADING):
            data = ShardData()
            started = time.perf_counter()
            try:
                records = await loop.run_in_executor(self._loader, replay_log, self.partition, self.log, data,
                                                     durable_only, lambda: self._closing)
            except LoadCancelled:
                return
            except TailNotCut as torn:  # each handler its own name: compiled, one name holds one type
                # What the partition holds was replayed (before a damaged tail that cannot be cut aside, or
                # its journal run that cannot be written into the log): serve it read-only; a reload
                # (which cuts the tail, or writes the run) comes before any write.
                if self.state is not _SHARD_LOADING:
                    return
                self._trouble.report(logging.ERROR, "partition %d: %s; serving its %d offsets read-only until the "
                                     "log can be written", self.partition, torn, data.num_offsets)
                self.data = data
                self._tail_dirty = True
                if self._transition(_SHARD_READ_ONLY):
                    self._task = asyncio.get_running_loop().create_task(self._probe_until_writable())
                return
            except (LogCorruptError, RecordError, BatchError) as corrupt:
                log.error("partition %d: FAILED to load, not serving its groups until the log is repaired: %s",
                          self.partition, corrupt)
                self._transition(_SHARD_FAILED)
                await self._abandon_journal()
                return
            except OSError as exc:
                self._trouble.report(logging.ERROR, "partition %d: cannot load its log (%s); retrying in %.1f s, "
                                     "backing off to every 30 s", self.partition, describe_error(exc), delay)
                self._transition(_SHARD_FAILED)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_BACKOFF_MAX_S)
                continue
            except Exception:
                log.exception("partition %d: FAILED to load (unexpected error), not serving its groups",
                              self.partition)
                self._transition(_SHARD_FAILED)
                # As for a corrupt log: left recovering, it kept the journal from deleting any segment, and
                # every other log from counting as synced, for the rest of the run (a review's find).
                await self._abandon_journal()
                return
            if self.state is not _SHARD_LOADING:
                return  # closed meanwhile
            self._trouble.reset()
            elapsed = time.perf_counter() - started
            self.data = data
            self._next_offset = self.log.next_offset
            self._metrics.partition_loaded(self.partition, records, elapsed)
            log.log(logging.INFO if records else logging.DEBUG,
                    "partition %d: loaded %d records (%d offsets, %d groups) in %d ms",
                    self.partition, records, data.num_offsets, len(data.groups), elapsed * 1000)
            if durable_only:
                self._tail_dirty = True
                if self._transition(_SHARD_READ_ONLY):
                    self._task = asyncio.get_running_loop().create_task(self._probe_until_writable())
                return
            await self._serve_if_writable()
            return

    async def _abandon_journal(self) -> None:
        """A corrupt log: its journal batches are kept beside it, and the journal stops holding them."""
        try:
            kept = await asyncio.get_running_loop().run_in_executor(self._loader, self.log.abandon_journal)
        except OSError as exc:
            log.error("partition %d: could not copy its journal batches aside (%s); the journal keeps them",
                      self.partition, describe_error(exc))
            return
        if kept is None:
            return
        if kept.batches is not None:
            log.error("partition %d: its journal batches are kept in %s for the repair", self.partition, kept.batches)
        if kept.synced_end is not None:
            log.error("partition %d: the offset its log reached on disk at the last checkpoint is kept in %s: the "
                      "log must reach it to load", self.partition, kept.synced_end)

    @property
    def compactable(self) -> bool:
        """Serving (ACTIVE), or READ_ONLY for want of room with its log as loaded (no tail left to cut,
        no journal run to write): compaction then gives a full disk room back, where nothing else would
        (a fault campaign's disk stayed full with every partition read-only)."""
        return self.state is _SHARD_ACTIVE or (self.state is _SHARD_READ_ONLY and not self._tail_dirty)

    def reload_before_writing(self) -> None:
        """A read-only partition whose log may have lost pages (a failed checkpoint): it reloads (from
        the journal) before it writes again, not straight back to ACTIVE."""
        if self.state is _SHARD_READ_ONLY:
            self._tail_dirty = True

    async def _serve_if_writable(self) -> None:
        problem = await asyncio.get_running_loop().run_in_executor(self.writer, self._probe)
        if problem is None:
            self._transition(_SHARD_ACTIVE)
            return
        if self._transition(_SHARD_READ_ONLY):
            self._unwritable.report(logging.ERROR, "partition %d: its log cannot be written (%s): serving reads only, "
                                    "commits to its groups get NOT_COORDINATOR until writing works again (checked "
                                    "every %.0f s)", self.partition, problem, PROBE_INTERVAL_S)
            self._write_failed = True  # the first flush once room is back resets the reports and wakes the cleaner
            self.wake_cleaner()
            self._task = asyncio.get_running_loop().create_task(self._probe_until_writable())

    def _probe(self) -> str | None:
        """Writer thread: None if the log's directory takes a write + fsync, else what went wrong."""
        try:
            self.log.probe()
        except OSError as exc:
            return describe_error(exc)
        return None

    async def _probe_until_writable(self) -> None:
        loop = asyncio.get_running_loop()
        trouble = Repeated(log, REPEAT_LOG_S)
        while self.state is _SHARD_READ_ONLY and not self._closing:
            await asyncio.sleep(PROBE_INTERVAL_S)
            problem = await loop.run_in_executor(self.writer, self._probe)
            if problem is None:
                if self._tail_dirty:  # first cut the unacknowledged tail, then reload and serve
                    self._tail_dirty = False
                    if self._transition(_SHARD_FAILED):
                        self._task = asyncio.get_running_loop().create_task(self._recover())
                elif self._transition(_SHARD_ACTIVE):
                    log.warning("partition %d: its log is writable again; serving commits", self.partition)
                return
            trouble.report(logging.WARNING, "partition %d: still cannot write its log (%s)", self.partition, problem)

    @property
    def closing(self) -> bool:
        """kcoord is stopping (``close`` has begun)."""
        return self._closing

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

