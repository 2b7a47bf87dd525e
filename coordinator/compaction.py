"""Log compaction of one shard, run periodically (Kafka's cleaner backoff) by the runtime.

The in-memory state does not change: compaction keeps it equal. The rewrite runs on the cleaner thread;
only each swap runs on the shard's writer thread, and only if the shard still serves the same log, so
commits on partitions sharing that writer are held up for a rename, not a rewrite.
"""

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor

from coordinator.logfmt import Repeated, describe_error
from coordinator.metrics import Metrics
from coordinator.shard import Shard
from coordinator.shardlifecycle import REPEAT_LOG_S
from coordinator.shardstate import ShardState
from storage.cleaner import (
    CleanAborted,
    CleanRecord,
    CleanStats,
    clean,
    cleanable_count,
    compaction_horizon,
    dirty_ratio,
    record_clean,
    recorded_clean,
)
from storage.log import PartitionLog

log = logging.getLogger(__name__)

MIN_CLEANABLE_DIRTY_RATIO = 0.5  # Kafka's min.cleanable.dirty.ratio


class SwapRefused(Exception):
    """A compaction's swap found the shard reloaded, failed or closed since the compaction began."""


class SwapFailed(Exception):
    """A compaction's swap failed part-way: the live files need the shard's reopen path."""


class Compactor:
    """Compaction bookkeeping of one shard: where the clean part ends and when it was last cleaned."""

    def __init__(self, shard: Shard, cleaner: Executor, metrics: Metrics) -> None:
        self.shard = shard
        self._cleaner = cleaner
        self._metrics = metrics
        self._clean_end: int | None = None  # read from the log directory at the first look
        self._last_clean_ms = shard.clock.now_ms()
        # What the last clean saw: the log's durable end, and the latest delete horizon of the tombstones
        # it kept (None: none kept, or no clean yet in this process when ``_cleaned_to`` is None too).
        self._cleaned_to: int | None = None
        self._tombstone_horizon_ms: int | None = None
        self._stopping = False
        self._trouble = Repeated(log, REPEAT_LOG_S)

    def stop(self) -> None:
        self._stopping = True

    async def compact(self, delete_retention_ms: int) -> CleanStats | None:
        """Compacts closed segments when enough of the log is dirty, or when tombstones may have
        passed their delete horizon."""
        shard = self.shard
        if not shard.compactable or self._stopping:
            return None
        loop = asyncio.get_running_loop()
        now = shard.clock.now_ms()
        try:
            stats = await loop.run_in_executor(self._cleaner, self._compact_if_due, now, delete_retention_ms)
        except CleanAborted:
            return None
        except SwapRefused:
            log.info("partition %d: compaction abandoned, the partition was reloaded or closed, or the journal "
                     "keeps segments for a recovery, meanwhile", shard.partition)
            return None
        except SwapFailed as exc:
            if shard.state is ShardState.ACTIVE:
                shard.fail_write(exc)
            elif shard.compactable:  # read-only: reloads (the reopen finishes the swap) once the disk has room
                log.error("partition %d: compaction's swap failed (%s); reloading once its log can be written",
                          shard.partition, exc)
                shard.reload_before_writing()
            return None
        except Exception as exc:  # the rewrite failed before touching live files: try again next time
            # every pass while a read-only partition's disk stays full: once, then at most every REPEAT_LOG_S
            self._trouble.report(logging.ERROR, "partition %d: compaction failed, the log is unchanged: %s",
                                 shard.partition, describe_error(exc))
            return None
        self._trouble.reset()
        if stats is not None:
            self._metrics.log_cleaned(shard.partition, stats)
            log.info("partition %d: compacted %d segments into %d, %d -> %d bytes, %d records kept, %d dropped",
                     shard.partition, stats.segments_before, stats.segments_after, stats.bytes_before,
                     stats.bytes_after, stats.records_kept, stats.records_dropped)
        return stats

    def _compact_if_due(self, now: int, delete_retention_ms: int) -> CleanStats | None:
        plog = self.shard.log
        if not self.shard.compactable or _journal_holds(plog) or not cleanable_count(plog):
            return None
        if self._clean_end is None:
            # Also when the last pass before this start ran, what it saw and the horizon its tombstones
            # wait for: without them the pass for that horizon waited delete_retention_ms from the start,
            # so a log restarted more often than that kept its expired tombstones for good
            recorded = recorded_clean(plog)
            self._clean_end = recorded.clean_end
            if recorded.cleaned_at_ms is not None:
                self._last_clean_ms = min(self._last_clean_ms, recorded.cleaned_at_ms)
                self._cleaned_to, self._tombstone_horizon_ms = recorded.cleaned_to, recorded.horizon_ms
        dirty = dirty_ratio(plog, self._clean_end) >= MIN_CLEANABLE_DIRTY_RATIO
        if not dirty and (now - self._last_clean_ms < delete_retention_ms or self._nothing_new(plog, now)):
            return None
        cleaned_to = compaction_horizon(plog)
        stats = clean(plog, now, delete_retention_ms, self._swap_on_writer(plog), lambda: self._stopping)
        record_clean(plog, CleanRecord(stats.clean_end_offset, cleaned_to, stats.tombstone_horizon_ms, now))
        self._clean_end = stats.clean_end_offset
        self._last_clean_ms = now
        self._cleaned_to, self._tombstone_horizon_ms = cleaned_to, stats.tombstone_horizon_ms
        return stats

    def _nothing_new(self, plog: PartitionLog, now: int) -> bool:
        """Whether a pass for the delete horizon would find nothing to do: nothing was written since
        the last clean (no record can have been superseded, no segment closed), and no tombstone it
        kept has passed its horizon. (Kafka's cleaner has no such pass: it cleans by dirty ratio or
        max compaction lag only; kcoord adds it so tombstones go once their horizon passes.) Without
        this an idle log was rewritten, to no effect, every backoff once the delete retention was
        short (a campaign's find: 19,704 of 23,023 passes in one run)."""
        horizon = self._tombstone_horizon_ms
        return compaction_horizon(plog) == self._cleaned_to and (horizon is None or now < horizon)

    def _swap_on_writer(self, plog: PartitionLog) -> Callable[[Callable[[], None]], None]:
        """Runs a swap on the writer thread, only if ``plog`` is still the live log of an active shard."""
        shard = self.shard

        def guarded(swap: Callable[[], None]) -> None:
            if shard.log is not plog or not shard.compactable or _journal_holds(plog) or self._stopping:
                raise SwapRefused()
            try:
                swap()
            except Exception as exc:
                raise SwapFailed(repr(exc)) from exc

        def run(swap: Callable[[], None]) -> None:
            shard.writer.submit(guarded, swap).result()

        return run


def _journal_holds(plog: PartitionLog) -> bool:
    """The journal keeps segments for a partition yet to recover, or an earlier process's (until the
    first checkpoint after every partition recovered deletes them): a crash now would replay them
    whole, into every log, so none may be compacted (a merged log failed its partition at the next
    start, "no segment at or after the recovery point": a fault campaign's find, once the cleaner ran
    within a second of a start on a full disk; and a review's, the cleaner run between the last
    recovery and that checkpoint)."""
    return plog.journal is not None and (plog.journal.holding or plog.journal.keeps_earlier_segments)
