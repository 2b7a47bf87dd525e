"""Group commit across partitions, pipelined: the writer thread never waits for the event loop.

A shard with records to make durable asks for a flush; at the end of the loop pass the flusher *seals*
the open batch of every shard that asked and queues them for the writer thread. A writer cycle takes
everything sealed so far, appends each shard's batches as Kafka record batches, makes them durable
together (storage.sync: one ``syncfs`` per file system where that is safe, else an fsync per log) and
posts the results back to the loop, where each shard releases its waiting requests in order. Batches
sealed while a cycle runs are taken by the next cycle, which starts on the writer as soon as the
previous one has synced: the hand-back to a busy loop and the next seal overlap the disk work instead
of adding to every commit's wait (measured: the loop round trip was a third of each cycle under load).

Ordering: every writer task (cycles, probes, log reopening, compaction swaps) runs on one thread in the
order submitted, and a cycle is queued whenever something is sealed and no cycle is queued yet, so
every batch sealed before a task is submitted is appended before that task runs. A shard may have
several sealed batches in flight; the shard (coordinator.shard) makes sure a batch sealed after one
whose write failed is never appended (see ``Shard.append_batches``).
"""

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, Protocol

from coordinator.metrics import Metrics
from storage.log import PartitionLog
from storage.sync import FileSync

log = logging.getLogger(__name__)

# A sealed batch's outcome: the bytes appended for it, or what failed it.
FlushOutcome = int | BaseException


class Flushable(Protocol):
    """What the flusher needs of a shard (coordinator.shard.Shard)."""

    log: PartitionLog

    def take_batch(self) -> Any | None: ...

    def append_batches(self, works: list[Any]) -> int: ...

    def write_failed(self, works: list[Any]) -> None: ...

    def flushed(self, work: Any, outcome: FlushOutcome) -> None: ...


Job = tuple[Flushable, Any]


class Flusher:
    def __init__(self, writer: Executor, sync: FileSync, metrics: Metrics) -> None:
        self._writer = writer
        self._sync = sync
        self._metrics = metrics
        self._asked: dict[int, Flushable] = {}  # by id, in the order they asked (loop only)
        self._sealing = False  # a seal is scheduled for the next loop pass (loop only)
        self._lock = threading.Lock()  # guards the two below, shared with the writer thread
        self._sealed: list[Job] = []  # sealed, not yet taken by a writer cycle
        self._queued = False  # a writer cycle is queued and has not started

    def request(self, shard: Flushable) -> None:
        """On the loop: ``shard`` has a new open batch. It is sealed at the end of this loop pass, so
        every request arriving in the same pass shares it."""
        self._asked[id(shard)] = shard
        if not self._sealing:
            self._sealing = True
            asyncio.get_running_loop().call_soon(self._seal)

    def _seal(self) -> None:
        self._sealing = False
        jobs: list[Job] = []
        for shard in self._asked.values():
            work = shard.take_batch()
            if work is not None:
                jobs.append((shard, work))
        self._asked.clear()
        if not jobs:
            return
        loop = asyncio.get_running_loop()
        with self._lock:
            self._sealed.extend(jobs)
            if self._queued:
                return  # the queued cycle has not started yet: it takes these too
            self._queued = True
        try:
            self._writer.submit(self._cycle, loop)
        except RuntimeError as exc:  # the writer has shut down: the process is stopping
            with self._lock:
                jobs, self._sealed, self._queued = self._sealed, [], False
            self._written(jobs, [exc] * len(jobs), None)

    def _cycle(self, loop: asyncio.AbstractEventLoop) -> None:
        """Writer thread: one cycle over everything sealed so far; the results go back to the loop."""
        with self._lock:
            jobs, self._sealed, self._queued = self._sealed, [], False
        if not jobs:
            return
        try:
            outcomes, seconds = self._write(jobs)
        except BaseException as exc:  # a bug here must still answer every request of the cycle
            log.exception("a flush cycle failed")
            outcomes, seconds = [exc] * len(jobs), None
        try:
            loop.call_soon_threadsafe(self._written, jobs, outcomes, seconds)
        except RuntimeError:  # the loop is closed: the process is stopping
            pass

    def _write(self, jobs: list[Job]) -> tuple[list[FlushOutcome], float | None]:
        """Appends each shard's batches (all of a shard's at once, in the order sealed), then makes
        the logs appended to durable together. Returns each job's outcome and the sync's seconds."""
        outcomes: list[FlushOutcome] = [0] * len(jobs)
        by_shard: dict[int, tuple[Flushable, list[int]]] = {}
        for i, (shard, _) in enumerate(jobs):
            by_shard.setdefault(id(shard), (shard, []))[1].append(i)
        appended: list[tuple[Flushable, list[int]]] = []
        for shard, indexes in by_shard.values():
            try:
                outcomes[indexes[-1]] = shard.append_batches([jobs[i][1] for i in indexes])
                appended.append((shard, indexes))
            except Exception as exc:
                for i in indexes:
                    outcomes[i] = exc
        if not appended:
            return outcomes, None
        started = time.perf_counter()
        results = self._sync.sync([shard.log for shard, _ in appended])
        seconds = time.perf_counter() - started
        for (shard, indexes), error in zip(appended, results, strict=True):
            if error is not None:
                shard.write_failed([jobs[i][1] for i in indexes])
                for i in indexes:
                    outcomes[i] = error
        return outcomes, seconds

    def _written(self, jobs: list[Job], outcomes: list[FlushOutcome], seconds: float | None) -> None:
        """On the loop: every shard of the cycle releases (or fails) its batches, in order."""
        if seconds is not None:
            self._metrics.synced(seconds, len({id(s) for (s, _), o in zip(jobs, outcomes, strict=True)
                                                if not isinstance(o, BaseException)}))
        for (shard, work), outcome in zip(jobs, outcomes, strict=True):
            _guarded(shard.flushed, work, outcome)

    def close(self) -> None:
        self._sync.close()


def _guarded(fn: Callable[..., None], *args: Any) -> None:
    """One shard's trouble releasing its requests must not keep the other shards' requests waiting."""
    try:
        fn(*args)
    except Exception:
        log.exception("releasing a flushed batch failed")
