"""The runtime of one ``__consumer_offsets`` partition: its state machine, write path and loader.

Write path (group commit): a handler's records get the next log offsets and are replayed into memory at
once, so the next operation sees them; they join the *open* batch and the caller receives the open
batch's future. A single writer thread encodes the batch, appends it and fsyncs; the future resolves
only then. While one batch is being written the next one fills up, so many commits share one fsync.
Reads that produce no records wait on ``barrier()``: everything they could have seen is durable first.

Fail-stop: if an append or fsync fails, every parked request fails (answered NOT_COORDINATOR), the
log is cut back to its last durable offset and the shard reloads from disk. No rollback logic: the
in-memory state is rebuilt by the same ``replay`` the loader always uses.
"""

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from enum import Enum

from coordinator.metrics import Metrics
from coordinator.state import NO_PRODUCER, ShardData
from protocol.errors import ErrorCode
from protocol.records import Record, RecordError, UnknownRecord, decode_record, encode_record
from storage.batch import COMMIT, BatchError, build_batch
from storage.cleaner import CleanAborted, CleanStats, clean, cleanable_count, dirty_ratio
from storage.log import LogCorruptError, PartitionLog

log = logging.getLogger(__name__)

MAX_BATCH_BYTES = 1024 * 1024  # Kafka's max.message.bytes for the offsets topic, about 1 MiB
MIN_CLEANABLE_DIRTY_RATIO = 0.5  # Kafka's min.cleanable.dirty.ratio
RELOAD_BACKOFF_S = 0.5
RELOAD_BACKOFF_MAX_S = 30.0


class ShardState(Enum):
    """LOADING: the log is being replayed; requests get COORDINATOR_LOAD_IN_PROGRESS; -> ACTIVE or FAILED.
    ACTIVE: serves reads and writes; -> FAILED on a write error, -> CLOSED on shutdown.
    FAILED: requests get NOT_COORDINATOR; after a write error the shard reloads (-> LOADING), after
    corruption found on load it stays FAILED until an operator repairs the log.
    CLOSED: shut down; requests get NOT_COORDINATOR."""

    LOADING = "loading"
    ACTIVE = "active"
    FAILED = "failed"
    CLOSED = "closed"


_STATE_ERRORS = {
    ShardState.LOADING: ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ShardState.FAILED: ErrorCode.NOT_COORDINATOR,
    ShardState.CLOSED: ErrorCode.NOT_COORDINATOR,
}


class ShardFailed(Exception):
    """The write a request was waiting for did not become durable."""


class LoadCancelled(Exception):
    pass


class SwapRefused(Exception):
    """A compaction's swap found the shard reloaded, failed or closed since the compaction began."""


class SwapFailed(Exception):
    """A compaction's swap failed part-way: the live files need the reopen path."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Shard:
    def __init__(
        self,
        partition: int,
        partition_log: PartitionLog,
        writer: Executor,
        loader: Executor,
        metrics: Metrics,
        cleaner: Executor | None = None,
    ) -> None:
        self.partition = partition
        self.log = partition_log
        self.state = ShardState.LOADING
        self.data = ShardData()
        self._writer = writer
        self._loader = loader
        self._cleaner = cleaner or writer
        self._metrics = metrics
        self._next_offset = 0
        self._open: list[tuple[bytes, bytes | None]] = []  # encoded records of the open batch
        self._open_future: asyncio.Future[None] | None = None
        self._inflight: asyncio.Future[None] | None = None
        self._closing = False
        self._reload: asyncio.Task[None] | None = None  # referenced so it is not collected mid-run
        self._clean_end = 0  # offset up to which the last compaction left the log clean
        self._last_clean_ms = now_ms()

    @property
    def error(self) -> ErrorCode | None:
        """The error a request for this shard's groups gets now, or None when it is ACTIVE."""
        return _STATE_ERRORS.get(self.state)

    # -- write path ----------------------------------------------------------------------------

    def append(self, records: list[Record]) -> "asyncio.Future[None]":
        """Replays ``records`` at the next offsets and returns a future that resolves once they are
        durable (or fails with ShardFailed). Only valid while ACTIVE. Records are encoded first, so
        one that cannot be encoded fails only its own request, never the batch it would have joined."""
        assert self.state is ShardState.ACTIVE, self.state
        encoded = [encode_record(r) for r in records]
        data = self.data
        offset = self._next_offset
        for record in records:
            data.replay(offset, record)
            offset += 1
        self._next_offset = offset
        self._open.extend(encoded)
        fut = self._open_future
        if fut is None:
            loop = asyncio.get_running_loop()
            fut = self._open_future = loop.create_future()
            if self._inflight is None:
                loop.call_soon(self._flush)
        return fut

    def barrier(self) -> "asyncio.Future[None] | None":
        """The future of the newest write not yet durable, if any: a read waits for it."""
        return self._open_future or self._inflight

    def _flush(self) -> None:
        if self._inflight is not None or self._open_future is None or self.state is not ShardState.ACTIVE:
            return
        entries, fut = self._open, self._open_future
        base = self._next_offset - len(entries)
        self._open, self._open_future = [], None
        self._inflight = fut
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        done = loop.run_in_executor(self._writer, self._write, base, entries, now_ms())
        done.add_done_callback(lambda t: self._flushed(t, fut, len(entries), started))

    def _write(self, base: int, entries: list[tuple[bytes, bytes | None]], timestamp: int) -> int:
        """Writer thread: batches of at most ~1 MiB, appended, then one fsync."""
        nbytes = 0
        chunk: list[tuple[bytes, bytes | None]] = []
        chunk_bytes = 0
        for entry in entries:
            size = len(entry[0]) + (len(entry[1]) if entry[1] is not None else 0) + 24
            if chunk and chunk_bytes + size > MAX_BATCH_BYTES:
                nbytes += self._append_batch(base, chunk, timestamp)
                base += len(chunk)
                chunk, chunk_bytes = [], 0
            chunk.append(entry)
            chunk_bytes += size
        nbytes += self._append_batch(base, chunk, timestamp)
        self.log.sync()
        return nbytes

    def _append_batch(self, base: int, entries: list[tuple[bytes, bytes | None]], timestamp: int) -> int:
        batch = build_batch(base, entries, timestamp)
        self.log.append(batch, base + len(entries) - 1)
        return len(batch)

    def _flushed(self, task: "asyncio.Future[int]", fut: "asyncio.Future[None]", n: int, started: float) -> None:
        self._inflight = None
        exc = task.exception()
        if exc is not None:
            self._fail(exc, fut)
            return
        fut.set_result(None)
        self._metrics.batch_flushed(n, task.result(), time.perf_counter() - started)
        if self._open_future is not None:
            self._flush()

    def _fail(self, exc: BaseException, inflight: "asyncio.Future[None] | None") -> None:
        log.error("partition %d: write failed, failing parked requests and reloading: %r", self.partition, exc)
        self._metrics.shard_failed(self.partition)
        self.state = ShardState.FAILED
        for fut in (inflight, self._open_future):
            if fut is not None and not fut.done():
                fut.set_exception(ShardFailed(str(exc)))
                fut.exception()  # parked requests handle it; do not warn about it
        self._open, self._open_future = [], None
        # One reload at a time: a second failure while reloading must not reopen or truncate a log
        # that the running reload is still recovering.
        if not self._closing and (self._reload is None or self._reload.done()):
            self._reload = asyncio.get_running_loop().create_task(self._reload_after_failure())

    async def _reload_after_failure(self) -> None:
        """Reopens the log (retrying with backoff: a full disk may be freed) and loads it again."""
        loop = asyncio.get_running_loop()
        delay = RELOAD_BACKOFF_S
        while not self._closing:
            try:
                await loop.run_in_executor(self._writer, self._reopen_log)
                break
            except Exception as exc:
                log.error("partition %d: cannot reopen its log (%r); retrying in %.1f s", self.partition, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RELOAD_BACKOFF_MAX_S)
        else:
            return
        await self.load()

    def _reopen_log(self) -> None:
        """Writer thread: cut what never became durable, then reopen the directory so whatever an
        interrupted compaction left is finished or discarded."""
        if self.log.recovered:
            self.log.truncate_to_durable()
        self.log.close()
        self.log = PartitionLog(self.log.directory, self.log.segment_bytes)

    # -- compaction (a timer operation) ----------------------------------------------------------

    async def compact(self, delete_retention_ms: int) -> CleanStats | None:
        """Compacts closed segments when enough of the log is dirty, or when tombstones may have
        passed their delete horizon. The in-memory state does not change: compaction keeps it equal.
        The rewrite runs on the cleaner thread; only each swap runs on this shard's writer thread, so
        commits on the partitions sharing that writer are held up for a rename, not a rewrite."""
        if self.state is not ShardState.ACTIVE or self._closing:
            return None
        loop = asyncio.get_running_loop()
        try:
            stats = await loop.run_in_executor(self._cleaner, self._compact_if_due, now_ms(), delete_retention_ms)
        except CleanAborted:
            return None
        except SwapRefused:
            log.info("partition %d: compaction abandoned, the partition was reloaded or closed meanwhile",
                     self.partition)
            return None
        except SwapFailed as exc:
            if self.state is ShardState.ACTIVE:
                self._fail(exc, None)
            return None
        except Exception as exc:  # the rewrite failed before touching live files: try again next time
            log.error("partition %d: compaction failed, the log is unchanged: %r", self.partition, exc)
            return None
        if stats is not None:
            self._metrics.log_cleaned(self.partition, stats)
            log.info("partition %d: compacted %d segments into %d, %d -> %d bytes, %d records kept, %d dropped",
                     self.partition, stats.segments_before, stats.segments_after, stats.bytes_before,
                     stats.bytes_after, stats.records_kept, stats.records_dropped)
        return stats

    def _compact_if_due(self, now: int, delete_retention_ms: int) -> CleanStats | None:
        if self.state is not ShardState.ACTIVE or not cleanable_count(self.log):
            return None
        dirty = dirty_ratio(self.log, self._clean_end) >= MIN_CLEANABLE_DIRTY_RATIO
        if not dirty and now - self._last_clean_ms < delete_retention_ms:
            return None
        stats = clean(self.log, now, delete_retention_ms, self._swap_on_writer(self.log), lambda: self._closing)
        self._clean_end = stats.clean_end_offset
        self._last_clean_ms = now
        return stats

    # -- loading -------------------------------------------------------------------------------

    def _swap_on_writer(self, plog: PartitionLog) -> "Callable[[Callable[[], None]], None]":
        """Runs a compaction swap on the writer thread, only if ``plog`` is still the live, active log."""

        def guarded(swap: Callable[[], None]) -> None:
            if self.log is not plog or self.state is not ShardState.ACTIVE or self._closing:
                raise SwapRefused()
            try:
                swap()
            except Exception as exc:
                raise SwapFailed(repr(exc)) from exc

        def run(swap: Callable[[], None]) -> None:
            self._writer.submit(guarded, swap).result()

        return run

    async def load(self) -> None:
        """Replays the whole log (in the loader pool) into fresh state, then serves it."""
        self.state = ShardState.LOADING
        data = ShardData()
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        try:
            records = await loop.run_in_executor(self._loader, self._replay_log, data)
        except LoadCancelled:
            return
        except (LogCorruptError, RecordError, BatchError, OSError) as exc:
            log.error("partition %d: FAILED to load, not serving its groups: %s", self.partition, exc)
            self._load_failed()
            return
        except Exception:
            log.exception("partition %d: FAILED to load (unexpected error), not serving its groups", self.partition)
            self._load_failed()
            return
        if self._closing:
            return
        elapsed = time.perf_counter() - started
        self.data = data
        self._next_offset = self.log.next_offset
        self.state = ShardState.ACTIVE
        self._metrics.partition_loaded(self.partition, records, elapsed)
        log.log(
            logging.INFO if records else logging.DEBUG,
            "partition %d: loaded %d records (%d offsets, %d groups) in %d ms",
            self.partition, records, data.num_offsets, len(data.groups), elapsed * 1000,
        )

    def _load_failed(self) -> None:
        self.state = ShardState.FAILED
        self._metrics.shard_failed(self.partition)

    def _replay_log(self, data: ShardData) -> int:
        """Loader thread: the same ``replay`` as the live path, for every record read back."""
        records = unknown = 0
        for batch in self.log.recover():
            if self._closing:
                raise LoadCancelled()
            if batch.control_type is not None:
                data.replay_end_transaction(batch.producer_id, batch.control_type == COMMIT)
                continue
            producer = batch.producer_id if batch.is_transactional else NO_PRODUCER
            for rec in batch.records:
                record = decode_record(rec.key, rec.value)
                if isinstance(record, UnknownRecord):
                    unknown += 1
                    continue
                data.replay(rec.offset, record, producer)
                records += 1
        if unknown:
            log.warning("partition %d: skipped %d records of types kcoord does not model", self.partition, unknown)
        return records

    # -- shutdown ------------------------------------------------------------------------------

    async def close(self) -> None:
        """Lets parked writes finish (they are acknowledged if they become durable), then closes."""
        self._closing = True
        while self.state is ShardState.ACTIVE and (self._inflight or self._open_future):
            pending = self._inflight or self._open_future
            assert pending is not None
            await asyncio.wait([pending])
        was_active = self.state is ShardState.ACTIVE
        self.state = ShardState.CLOSED
        await asyncio.get_running_loop().run_in_executor(self._writer, self._close_log, was_active)

    def _close_log(self, checkpoint: bool) -> None:
        if checkpoint:
            self.log.checkpoint()  # a clean stop: everything on disk is known durable
        self.log.close()
