"""A shard's lifecycle (coordinator.shard ``Shard`` is built on it): every state change, loading the log
into fresh state, the fail-stop recovery after a failed write, and the probe that brings a READ_ONLY
shard back. Apart from the shard's operations and write path, which only ask whether it is ACTIVE:
what happens between two ACTIVE spells is here.

Loading replays the whole log in the loader pool with the same ``replay`` the live path uses. A write
that failed drops the bytes this process appended past the durable end and reloads; a log that cannot
be written (full, read-only, no permission) is served READ_ONLY, probed every ``PROBE_INTERVAL_S``; a
corrupt one stays FAILED until an operator repairs it.
"""

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING, Final, cast

from mypy_extensions import mypyc_attr

from coordinator.loader import LoadCancelled, replay_log
from coordinator.logfmt import Repeated, describe_error
from coordinator.metrics import Metrics
from coordinator.pending import Batch
from coordinator.shardstate import ALLOWED_FROM, READ_ERRORS, ShardState
from coordinator.state import ShardData
from coordinator.timers import Clock, Timers
from protocol.errors import ErrorCode
from protocol.records import RecordError
from storage.batch import BatchError
from storage.log import LogCorruptError, PartitionLog, TailNotCut

if TYPE_CHECKING:
    from coordinator.shard import Shard

log = logging.getLogger(__name__)

RETRY_BACKOFF_S: Final = 0.5
RETRY_BACKOFF_MAX_S: Final = 30.0
PROBE_INTERVAL_S = 1.0  # how soon a READ_ONLY partition notices the disk is writable again
REPEAT_LOG_S: Final = 60.0  # a failure that persists is logged again at most this often

# Enum members as C variables, not class attributes (tests/protocol/test_compiled.py says why).
_SHARD_ACTIVE: Final = ShardState.ACTIVE
_SHARD_FAILED: Final = ShardState.FAILED
_SHARD_INITIAL: Final = ShardState.INITIAL
_SHARD_LOADING: Final = ShardState.LOADING
_SHARD_READ_ONLY: Final = ShardState.READ_ONLY


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled (setup.py); subclassed by coordinator/groups
class ShardHooks:
    """Domain code told when a shard starts serving writes (arm timers) and stops (answer parked
    requests, forget soft state). The default does nothing."""

    def on_loaded(self, shard: "Shard") -> None:
        pass

    def on_unloaded(self, shard: "Shard") -> None:
        pass


class ShardLifecycle:
    """The state of one partition's shard and what moves it; the operations on it: coordinator.shard."""

    def __init__(
        self,
        partition: int,
        partition_log: PartitionLog,
        writer: Executor,
        loader: Executor,
        metrics: Metrics,
        clock: Clock,
        hooks: ShardHooks | None,
        log_factory: "Callable[[Path, int], PartitionLog] | None",
    ) -> None:
        self.partition = partition
        self.log = partition_log
        self.state = _SHARD_INITIAL
        self.data = ShardData()
        self.clock = clock
        self.timers = Timers(clock)
        self.hooks = hooks or ShardHooks()
        self.writer = writer  # the thread that syncs this log, probes it, reopens it and swaps segments
        self._log_factory = log_factory or PartitionLog
        self._loader = loader
        self._metrics = metrics
        self._next_offset = 0  # the offset the next record appended gets (set from the log once loaded)
        self._inflight: Batch | None = None  # the batch the flusher is making durable
        self._closing = False
        self._task: asyncio.Task[None] | None = None  # the running reload or probe, kept referenced
        self._trouble = Repeated(log, REPEAT_LOG_S)
        self._tail_dirty = False  # READ_ONLY with an unacknowledged tail still on disk
        # The runtime's cleaner looks soon (coordinator.runtime) when a write fails, the log cannot be
        # written for want of room, or writes work again after failing: compaction gives room back
        self.wake_cleaner: Callable[[], None] = lambda: None
        self._write_failed = False  # set from a failed write until the next flush that succeeds
        # A disk that stays full makes a partition fail, reload read-only, find room and fail again every
        # few seconds: each of its ERROR lines once, then once a minute, until a flush succeeds.
        self._unwritable = Repeated(log, REPEAT_LOG_S)

    def _transition(self, to: ShardState) -> bool:
        """The only place the state changes: refused (False) unless ``to`` may follow the current state,
        so a close racing a reload ends CLOSED, never LOADING."""
        if self.state not in ALLOWED_FROM[to]:
            return False
        was_active = self.state is _SHARD_ACTIVE
        self.state = to
        self._metrics.shard_state(self.partition, to.value)
        try:
            shard = cast("Shard", self)  # the only subclass: the hooks use its operations
            if was_active:
                self.timers.cancel_all()
                self.hooks.on_unloaded(shard)
            if to is _SHARD_ACTIVE:
                self.hooks.on_loaded(shard)
        except Exception:  # a hook's bug must not leave requests unanswered or the shard half-changed
            log.exception("partition %d: %s hook failed", self.partition, "unload" if was_active else "load")
        return True

    def _load_progress(self, records: int) -> None:
        """Loader thread: how far the load under way has got (coordinator.loader)."""
        self._metrics.load_progress(self.partition, records)

    @property
    def read_error(self) -> ErrorCode | None:
        """The error a read for this shard's groups gets now, or None when it can serve reads."""
        return READ_ERRORS.get(self.state)

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
            self._metrics.load_progress(self.partition, 0)
            try:
                records = await loop.run_in_executor(self._loader, replay_log, self.partition, self.log, data,
                                                     durable_only, lambda: self._closing, self._load_progress)
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
        while True:
            await asyncio.sleep(PROBE_INTERVAL_S)
            if self.state is not _SHARD_READ_ONLY or self._closing:  # after the sleep: a stop may have ended the writer
                return
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

    # -- fail-stop recovery --------------------------------------------------------------------

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
