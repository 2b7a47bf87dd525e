"""Checkpoints: the partition logs synced behind the journal, and the journal cut back behind them.

With ``--sync-mode journal`` a commit is durable once the journal holds it (storage.journal); the
partition logs it was also appended to reach the disk here, every ``--checkpoint-interval-ms`` (250 ms;
sooner when the live journal segment passes CHECKPOINT_BYTES), off the commit path:

1. on the loop, the journal rotates to a new segment, and each log's ``journaled_end`` is taken: every
   log byte whose batch is in an older segment was appended before this moment;
2. on the checkpoint thread, one ``syncfs`` of the data directory's file system puts all of them on
   disk, and the older segments are unlinked (the directory fsynced: a segment that came back after a
   crash would replay batches the cleaner may since have compacted);
3. on the loop, each log counts as synced that far (which is what the cleaner may compact, and what
   its recovery point may claim; claims are recorded last, on the checkpoint thread, at most every
   CLAIM_INTERVAL_S).

Why 250 ms: the syncfs of a checkpoint competes with the journal's fdatasyncs for the disk, and its
cost grows with what gathered since the last one. Measured (bench.harness commit-1-half, paced at
40k commits/s, 2026-11-27): p99 1.8-2.3 ms without checkpoints, 3.0-3.2 ms every 250 ms, 4.0-4.7 ms
every second, 26 ms every 5 s; commit-1's peak was no lower at 250 ms than at 1 s.

A failed syncfs keeps every segment, and fails every serving partition: each reloads, rewriting from the
journal the batches its log holds since the last checkpoint (a page whose writeback failed may look
fine in the cache and be lost on disk), and the segments stay until each one has.
"""

import asyncio
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Final, TypeVar

from coordinator.logfmt import Repeated, describe_error
from coordinator.metrics import LATENCY_BUCKETS, Histogram
from coordinator.shard import Shard
from coordinator.shardstate import ShardState
from storage.journal import JournalSegment
from storage.journalentries import segment_name
from storage.journalsync import JournalSync
from storage.log import LogEnd, PartitionLog
from storage.sync import Claims

log = logging.getLogger(__name__)

CHECKPOINT_BYTES: Final = 16 << 20  # a live journal segment this large is checkpointed without waiting
POLL_S: Final = 0.1
# Recovery points are recorded at most this often (and at every clean close). In journal mode they only
# sharpen the verdict on damage (below a claim: corruption; past it: a torn tail the journal rewrites),
# and recording 44 of them (temporary files, renames, two syncfs: ~300 system calls, each giving the
# GIL back to a busy loop and waiting for it) with every checkpoint tripled the p99 of commits at half
# the peak rate (bench.harness commit-1-half at 40k/s: 11.7-16.8 ms against 4.2-4.8 ms without).
CLAIM_INTERVAL_S: Final = 30.0
REPEAT_LOG_S: Final = 60.0
T = TypeVar("T")


class Checkpointer:
    def __init__(self, sync: JournalSync, shards: Sequence[Shard], interval_s: float) -> None:
        self._sync = sync
        self._shards = shards
        self._interval_s = interval_s
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kcoord-checkpoint")
        self._last = time.monotonic()
        self._claimed_at = time.monotonic()
        self._trouble = Repeated(log, REPEAT_LOG_S)
        # for coordinator.exporter
        self.completed = 0
        self.failed = 0
        self.seconds = Histogram(LATENCY_BUCKETS)  # each checkpoint's syncfs and journal deletions
        self.synced_at = time.monotonic()  # when the last checkpoint completed (or the process started)

    async def run(self) -> None:
        """Checkpoints while the process runs: every interval when anything was journaled since, or
        when a log holds acknowledged bytes no checkpoint could count yet (their journal sync was in
        flight during the last one: without another, a server going idle then left them unmarked,
        and their recovery point unrecorded, until its stop)."""
        while True:
            await asyncio.sleep(min(self._interval_s, POLL_S))
            journal = self._sync.journal
            due = time.monotonic() - self._last >= self._interval_s
            if journal.live_size >= CHECKPOINT_BYTES or (due and (journal.live_size or journal.retained > 1
                                                                  or journal.entry_due or self._logs_behind())):
                await self.checkpoint()
            elif due:  # nothing journaled since the last one: the logs hold everything (age 0, not stalled)
                self._last = self.synced_at = time.monotonic()

    async def checkpoint(self) -> bool:
        """One checkpoint (see the module docstring); False if its sync failed, or it could not start."""
        self._last = time.monotonic()
        loop = asyncio.get_running_loop()
        journal = self._sync.journal
        # Each shard's log read once: a reload replaces it from the writer thread (a fresh log read
        # second had offset 0 for its end, which the synced-ends entry then claimed: a review's find).
        # A failed partition's log may still count as recovered (its read-only reload found damage).
        logs = [plog for shard in self._shards
                if (plog := shard.log).recovered and shard.state is not ShardState.FAILED]
        # Journaled and acknowledged: a batch whose journal sync is still under way (or will fail)
        # must not count as synced (the cleaner would let it hide the acknowledged record it replaces,
        # and a recovery point could claim bytes a failed sync then cuts).
        ends = [plog.acknowledged_end() for plog in logs]
        try:
            boundary = journal.rotate()
        except OSError as exc:  # no segment to rotate to (EMFILE, ENOSPC): nothing synced or deleted
            self.failed += 1
            self._trouble.report(logging.ERROR, "checkpoint could not start a journal segment (%s); trying again "
                                 "in %d ms", describe_error(exc), self._interval_s * 1000)
            return False
        holding = journal.holding
        # Written before the older segments go, for the syncfs to make durable with the logs: how far
        # each log is on disk once it has (storage.journal ``write_synced_ends``).
        journal.write_synced_ends({plog.partition: end[0] for plog, end in zip(logs, ends, strict=True)})
        drop = journal.droppable(boundary)
        spare = journal.reserve_spare()
        started = time.perf_counter()
        try:
            dropped, made = await _to_its_end(loop.run_in_executor(self._thread, self._sync_and_delete, drop, spare))
        except OSError as exc:
            self.failed += 1
            if _stopping():  # the segments stay: the next start replays them
                log.error("checkpoint failed at the stop (%s)", describe_error(exc))
                raise asyncio.CancelledError() from exc
            self._failed(exc)
            return False
        self.seconds.observe(time.perf_counter() - started)
        self.synced_at = time.monotonic()
        if made is not None:
            journal.adopt_spare(made)
        if not dropped:  # a partition began to recover meanwhile: every segment stays
            drop, holding = [], True
        journal.checkpointed(boundary)
        journal.deleted(drop)
        self._trouble.reset()
        # While segments are kept, they are replayed whole at a start after a crash, into every
        # partition's log from each one's first batch there: no log counts as synced past that (the
        # cleaner would compact what the replay then writes into, and the partition fail its recovery:
        # a fault campaign's find) until a checkpoint deletes them.
        claims = {} if holding else self._synced(logs, ends, time.monotonic() - self._claimed_at >= CLAIM_INTERVAL_S)
        if _stopping():  # recovery points are recorded by the stop's own close of every log
            raise asyncio.CancelledError()
        if claims:
            self._claimed_at = time.monotonic()
            try:
                recording = loop.run_in_executor(self._thread, self._sync.record, claims)
            except RuntimeError:  # shut down meanwhile
                pass
            else:
                await _to_its_end(recording)
                if _stopping():
                    raise asyncio.CancelledError()
        self.completed += 1
        return True

    def _logs_behind(self) -> bool:
        return any(shard.log.disk_behind() for shard in self._shards)

    def _sync_and_delete(self, drop: list[JournalSegment], spare: int) -> tuple[bool, JournalSegment | None]:
        """Checkpoint thread: the logs on disk, then the journal segments they make redundant (False: all
        kept, ``Journal.drop``), then the next rotation's segment made ahead (for the loop to adopt)."""
        self._sync.checkpoint_sync()
        journal = self._sync.journal
        kept = drop[-1] if spare and drop else None  # the newest: the most blocks already written
        dropped = journal.drop([seg.path for seg in drop if seg is not kept])
        reuse = kept.path if kept is not None and dropped else None
        if not spare:
            return dropped, None
        try:
            return dropped, journal.make_spare(spare, reuse)
        except OSError as exc:  # the next rotation makes its own (its first cycle on the writer thread)
            log.warning("journal: could not make the next segment ahead (%s)", describe_error(exc))
        if reuse is not None:  # under its old name or the new one: either must go (raises: checkpoint failed)
            journal.delete([reuse, journal.directory / segment_name(spare)])
        return dropped, None

    def _synced(self, logs: list[PartitionLog], ends: list[LogEnd], take_claims: bool) -> Claims:
        """On the loop: each log synced to its end at the rotation; with ``take_claims``, the recovery
        points to record."""
        claims: Claims = {}
        for plog, end in zip(logs, ends, strict=True):
            plog.disk_synced(end)
            if take_claims and plog.checkpoint_due():
                claim = plog.take_claim()
                if claim is not None:
                    claims[str(plog.directory)] = (plog, claim)
        return claims

    def _failed(self, exc: OSError) -> None:
        self._trouble.report(logging.ERROR, "checkpoint failed (%s): the journal keeps every batch since the last "
                             "one, and every partition reloads from it", describe_error(exc))
        self._sync.journal.hold({shard.partition for shard in self._shards})
        for shard in self._shards:  # the others recover (from the journal) before they serve writes
            if shard.state is ShardState.ACTIVE:
                shard.fail_write(exc)
            elif shard.state is ShardState.READ_ONLY:
                shard.reload_before_writing()

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)


async def _to_its_end(work: "asyncio.Future[T]") -> T:
    """``work``'s result, awaited to its end even when the checkpoint is cancelled meanwhile (a stop:
    ``_stopping`` then says so). Work on the checkpoint thread cannot be interrupted, so its outcome is
    kept, and the stop waits for the checkpoint (coordinator.runtime) before the journal closes and the
    directory's lock goes. Left running, it renamed and deleted journal segments by number after the
    process had let go of the directory: those of a kcoord started on it meanwhile (a campaign's find,
    with a checkpoint slowed by a busy disk)."""
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        return await work


def _stopping() -> bool:
    """The checkpoint's task was cancelled (a stop) while it waited for its thread (``_to_its_end``)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
