"""Group commit across partitions: one flush cycle at a time for every shard.

A shard with records to make durable asks for a flush; the next cycle takes the open batch of every
shard that asked and appends each to its log as Kafka record batches, on the event loop (a write into
the page cache: microseconds), then hands the sync to the writer thread (coordinator.writer), which
makes all of them durable together (storage.sync: one ``syncfs`` per file system where that is safe,
else an fsync per log) and hands the results back to the event loop in one call, where each shard
releases its waiting requests. When that sync is one system call (one log's fsync, or one syncfs:
nearly every cycle), the sync helper process makes it instead (storage.synchelper), which costs the
loop a ``sendmsg`` and a readable callback and never waits for the GIL; the writer thread keeps the
rest, and every cycle once the helper is gone. Commits arriving meanwhile gather in the shards' next open batches.
Compared with one fsync and two thread hand-offs per shard, this is what lets durable commits spread
over many partitions share the disk's flushes.

Why the appends are not on the writer thread (they were): every ``os.write`` there gives up the GIL
and then waits for the busy event loop to hand it back (up to the switch interval), so a cycle
appending to 15 logs spent ~2 of its ~3.3 ms waiting for the GIL, and commits waited with it. On the
loop the same writes cost ~0.1 ms in all and the writer crosses the GIL once per cycle. The writer
thread keeps what can block for long: syncs, probes, reopening and compaction swaps (which touch only
closed segments; an append touches only the active one).

Appending ahead: while the sync helper syncs a cycle, the shards waiting for the next one append
their records (``write_ahead``: a pass in the loop pass after any shard opens a new batch, appending
what every waiting shard has so far; records joining a batch already open wait for the next such
pass or for their cycle, which appends the rest), so when the sync is back the next
cycle is posted at once, and only then are the finished cycle's requests released (their replies are
encoded and written while the disk syncs). Each log's end is taken when its sync is posted and only
that much is marked durable when it is back (storage.log ``end``/``synced``). Never while the writer
thread syncs (it reads the logs' state), never into a new segment (the sync in flight would not cover
its directory entry), and a failed sync also fails every shard that appended ahead during it. Measured
(bench.harness commit-1, alternated with the tree before): 67-69k against 46-55k commits/s, the loop's
share of each ~0.6 ms cycle (the appends, ~0.1 ms; the release, ~0.05 ms) no longer between two syncs.
"""

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from coordinator.metrics import Metrics
from coordinator.writer import WriterThread
from storage.log import LogEnd, PartitionLog
from storage.sync import FileSync, SyncResult
from storage.synchelper import SyncHelper, SyncHelperGone

log = logging.getLogger(__name__)

# A shard's part of a cycle: the bytes it appended, or what failed it.
FlushOutcome = int | BaseException


class Flushable(Protocol):
    """What the flusher needs of a shard (coordinator.shard.Shard)."""

    log: PartitionLog

    def take_batch(self) -> Any | None: ...

    @property
    def written_ahead(self) -> bool: ...

    def append_batch(self, work: Any) -> int: ...

    def write_ahead(self) -> None: ...

    def synced(self, work: Any) -> None: ...

    def flushed(self, work: Any, started: float, outcome: FlushOutcome) -> None: ...

    def fail_write(self, exc: BaseException) -> None: ...


class Flusher:
    def __init__(self, writer: WriterThread, sync: FileSync, metrics: Metrics,
                 helper: SyncHelper | None = None) -> None:
        self._writer = writer
        self._sync = sync
        self._metrics = metrics
        self.helper = helper
        self._asked: dict[int, Flushable] = {}  # by id, in the order they asked
        self._running = False
        self._scheduled = False
        self._cycle_started = 0.0
        self._appending = False  # a cycle's appends are under way (a frozen file system blocks them)
        self._helper_syncing = False  # the cycle in flight is the sync helper's: appends may go on
        self._ahead_scheduled = False

    def use_sync(self, sync: FileSync) -> None:
        """Replaces how cycles are made durable (coordinator.runtime: the journal's, once the data
        directory is open); before the first cycle only."""
        self._sync.close()
        self._sync = sync

    def sync_pending_s(self) -> float:
        """Seconds the cycle in progress has been under way (appends and sync), 0 without one. Read
        by the exporter's thread: plain attributes, a torn read only gives a stale figure. Its appends
        count: on a frozen or hung file system the loop blocks in them, before the sync is posted."""
        return time.perf_counter() - self._cycle_started if self._running or self._appending else 0.0

    def start(self) -> None:
        """On the loop: starts the sync helper process, if there is one to start."""
        if self.helper is not None and not self.helper.start(asyncio.get_running_loop()):
            self.helper = None

    def request(self, shard: Flushable) -> None:
        """On the loop: ``shard`` has an open batch. It joins the next cycle (started in the next loop
        pass, so requests arriving in the same pass share it)."""
        self._asked[id(shard)] = shard
        if not self._running:
            if not self._scheduled:
                self._scheduled = True
                asyncio.get_running_loop().call_soon(self._cycle)
        elif self._helper_syncing and not self._ahead_scheduled:
            self._ahead_scheduled = True
            asyncio.get_running_loop().call_soon(self._write_ahead)

    def _write_ahead(self) -> None:
        """While the sync helper syncs a cycle, the shards waiting for the next one append what they
        have (a pass after any shard opens a new batch), so the next cycle mostly only posts its sync. The
        logs' ends are taken when a sync is posted, and only what was appended before counts as
        durable when it is back. Not while the writer thread syncs: it reads the logs' state there."""
        self._ahead_scheduled = False
        if self._running and self._helper_syncing:
            for shard in self._asked.values():
                shard.write_ahead()

    def _cycle(self) -> None:
        self._scheduled = False
        if self._running or not self._asked:
            return
        jobs: list[tuple[Flushable, Any]] = []
        outcomes: list[FlushOutcome] = []
        started = self._cycle_started = time.perf_counter()
        self._appending = True
        try:
            for shard in self._asked.values():
                work = shard.take_batch()
                if work is None:
                    continue
                jobs.append((shard, work))
                try:
                    outcomes.append(shard.append_batch(work))
                except Exception as exc:
                    outcomes.append(exc)
        finally:
            self._appending = False
        self._asked.clear()
        if not jobs:
            return
        appended = [i for i, outcome in enumerate(outcomes) if not isinstance(outcome, BaseException)]
        if not appended:
            self._finish(jobs, started, outcomes)
            return
        self._running = True
        try:
            self._hand_off([jobs[i][0].log for i in appended], jobs, outcomes, appended, started)
        except Exception as exc:  # nothing would ever end this cycle: fail it rather than hold every commit
            log.exception("handing a flush cycle's sync off failed")
            self._finish(jobs, started, [exc] * len(jobs))

    def _hand_off(self, logs: list[PartitionLog], jobs: list[tuple[Flushable, Any]], outcomes: list[FlushOutcome],
                  appended: list[int], started: float) -> None:
        """The sync to the helper process when it is one system call, else to the writer thread. With a
        journal, its write first: a failed one fails the cycle and every shard that appended ahead."""
        ends = [plog.end() for plog in logs]  # what this cycle's sync makes durable, each log's
        try:
            self._sync.prepare(logs, ends)
        except Exception as failed:  # compiled: one name per exception type in a function
            log.error("writing the journal failed: %s", failed)
            self._finish(jobs, started, [failed] * len(jobs), failed)
            return
        helper = self.helper
        if helper is not None and helper.alive:
            planned = self._sync.plan(logs)
            if planned is not None and helper.post(planned[0], planned[1], self._helper_synced, logs,
                                                   ends, jobs, outcomes, appended, started):
                self._helper_syncing = True
                return
        try:
            self._writer.post(self._sync_logs, (logs,), asyncio.get_running_loop(),
                              self._written, jobs, outcomes, appended, started, False)
        except RuntimeError as exc:  # the writer has shut down: the process is stopping
            self._finish(jobs, started, [exc] * len(jobs))

    def _sync_logs(self, logs: list[PartitionLog]) -> tuple[list[BaseException | None], float]:
        """Writer thread: makes the appended logs durable together; each log's error (or None) and
        the sync's seconds."""
        started = time.perf_counter()
        results = self._sync.sync(logs)
        return results, time.perf_counter() - started

    def _helper_synced(self, logs: list[PartitionLog], ends: list[LogEnd], jobs: list[tuple[Flushable, Any]],
                       outcomes: list[FlushOutcome], appended: list[int], started: float, error: BaseException | None,
                       seconds: float) -> None:
        """On the loop, when the sync helper answered (or ended: ``error`` says the sync may not have
        happened, and the cycle fails)."""
        self._helper_syncing = False
        if isinstance(error, SyncHelperGone):  # not a sync that failed: no sync, as far as anyone knows
            self._written(jobs, outcomes, appended, started, True, error)
            return
        results: SyncResult
        try:
            results = self._sync.planned_done(logs, error, ends)
        except Exception as exc:  # the cycle must end whatever happens, or no commit is answered again
            log.exception("completing a flush cycle failed")
            results = [exc] * len(logs)
        self._written(jobs, outcomes, appended, started, True, (results, seconds))

    def _written(self, jobs: list[tuple[Flushable, Any]], outcomes: list[FlushOutcome], appended: list[int],
                 started: float, by_helper: bool,
                 synced: "tuple[list[BaseException | None], float] | BaseException") -> None:
        """On the loop, with what ``_sync_logs`` returned or raised (WriterStopped: it never ran), or
        the sync helper's results."""
        sync_failure: BaseException | None = None
        self._sync.settle(synced if isinstance(synced, BaseException) else None)
        if isinstance(synced, BaseException):
            outcomes = [synced] * len(jobs)
            sync_failure = synced
        else:
            results, seconds = synced
            for i, error in zip(appended, results, strict=True):
                if error is not None:
                    outcomes[i] = sync_failure = error
            self._metrics.synced(seconds, sum(1 for o in outcomes if not isinstance(o, BaseException)), by_helper)
        self._finish(jobs, started, outcomes, sync_failure)

    def _finish(self, jobs: list[tuple[Flushable, Any]], started: float, outcomes: list[FlushOutcome],
                sync_failure: BaseException | None = None) -> None:
        """The cycle's outcome, per shard. Failed shards are failed first; after a failed sync (not a
        failed append: that touched one log), so is every shard that appended ahead during it (a
        syncfs's error cannot be told apart by file, and is reported once: a later syncfs would call
        their lost pages durable). The next cycle then starts at once, before this one's requests are
        released, so the disk syncs what gathered meanwhile while the replies are encoded and written."""
        self._running = False
        for (shard, work), outcome in zip(jobs, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                _guarded(shard.flushed, work, started, outcome)
            else:
                _guarded(shard.synced, work)
        if sync_failure is not None:
            for shard in list(self._asked.values()):
                if shard.written_ahead:
                    _guarded(shard.fail_write, sync_failure)
        if self._asked:
            self._cycle()
        for (shard, work), outcome in zip(jobs, outcomes, strict=True):
            if not isinstance(outcome, BaseException):
                _guarded(shard.flushed, work, started, outcome)

    def close(self) -> None:
        if self.helper is not None:
            self.helper.close()
        self._sync.close()


def _guarded(fn: Callable[..., None], *args: Any) -> None:
    """One shard's trouble releasing its requests must not keep the other shards' requests waiting."""
    try:
        fn(*args)
    except Exception:
        log.exception("releasing a flushed batch failed")
