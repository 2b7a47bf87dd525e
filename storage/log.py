"""One ``__consumer_offsets`` partition on disk: a directory of segment files.

On-disk layout (Kafka's own, reference section 8.4):

* ``<data-dir>/__consumer_offsets-<p>/<20-digit base offset>.log``: concatenated v2 record batches, no
  file header. A segment rolls when the next batch would take it past ``segment_bytes``.
* Offset/time index files are not written: Kafka rebuilds missing indexes from the ``.log`` files and
  kcoord always reads segments from the start.
* ``<base>.log.<position>.tr``: bytes cut from a segment on load: damage past the recovery point (a
  torn write of a crashed process, or bytes appended behind our back). They are never silently
  dropped; an operator can inspect them, the newest ``ASIDE_KEPT`` (10) of them: a recovery removes
  older ones beyond that, with a warning naming them (storage.segments ``prune_aside``). Bytes *this*
  process appended past the durable end when a write or fsync failed are truncated without a copy:
  nobody was told about them, and the likeliest cause of the failure is a full disk, where a copy
  cannot be made.
* ``recovery-point``: ``<segment base> <byte position>`` up to which the log is known durable (written,
  fsynced and renamed into place on clean close, before a compaction swap merges segments past it,
  and about once a second while commits arrive: with ``syncfs`` by storage.sync's recorder thread,
  off the commit path; with the journal, at most every 30 s by coordinator.checkpointer; it only
  ever moves forward). Damage below it is corruption and fails the partition; any damage past it,
  whatever its shape, is treated as a torn tail and cut aside, as Kafka's log recovery truncates at
  the first invalid batch after its ``recovery-point-offset-checkpoint``. With the journal, the offset
  its last checkpoint synced the log to (its synced-ends entry, storage.journalentries) counts as a
  recovery point too: damage before it, or a log ending short of it, fails the partition.
* ``<base>-<end>.swap``: a compacted replacement for every segment with base offset in [base, end),
  written and fsynced by the cleaner before the originals are removed. Opening the log finishes an
  interrupted swap; a ``.cleaned`` file is an unfinished cleaner output and is deleted.
* ``cleaner-offset``: where the last compaction ended (storage.cleaner), only to tell when the log is
  dirty enough to compact again, and when the pass for kept tombstones' delete horizon is due.

Durability contract: ``append`` only buffers into the OS; ``sync`` fsyncs the data (and the directory
when a segment was created) and advances ``durable_offset``. Callers acknowledge nothing above it.
With a journal (storage.journal) ``append`` also queues the batch for it, ``journaled`` advances
``durable_offset`` once the journal is synced, and ``synced_offset`` (what is on disk in the log itself:
what the cleaner may compact and a recovery point may claim) follows at checkpoints (``disk_synced``);
``recover`` writes the journal's batches back over the log first. Segment files: storage.segments.
"""

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from storage.batch import Batch, decode_batch, read_head
from storage.journalentries import JournalError, batch_offsets, clear_for_run, resolve
from storage.recoverypoint import RECOVERY_POINT as RECOVERY_POINT
from storage.recoverypoint import RecoveryPointOwner, claim_lock, run_reaches, short_of
from storage.segments import (
    Damage,
    Segment,
    aside_files,
    cut_aside,
    finish_interrupted_swaps,
    fsync_existing,
    fsync_path,
    kept_journal_end,
    list_segments,
    prune_aside,
    read_segment,
    segment_name,
    set_aside,
)

if TYPE_CHECKING:
    from storage.journal import Journal, KeptAside

log = logging.getLogger(__name__)

DEFAULT_SEGMENT_BYTES = 100 * 1024 * 1024
PROBE_FILE = ".write-probe"
PROBE_BYTES = 64 * 1024
CHECKPOINT_INTERVAL_S = 1.0
LogEnd = tuple[int, int, int]  # next offset, active segment's base offset, its size: PartitionLog.end()


class LogCorruptError(Exception):
    """Corruption before the tail of a partition: the partition must not serve from a guess."""


class TailNotCut(Exception):
    """A damaged tail past the recovery point could not be cut aside (disk full, read-only): every batch
    before it has been read, and the log must not be written until a later recovery cuts it."""


class RunNotWritten(TailNotCut):
    """The journal's run could not be written over the log (disk full, read-only): every batch the
    partition holds has still been read, the log's and then the rest of the run's from the journal,
    which keeps them; the log must not be written until a later recovery writes the run."""


class PartitionLog(RecoveryPointOwner):
    """Segments of one partition. Not thread-safe: one thread at a time (the shard's writer). Its recovery
    point's claims: storage.recoverypoint ``RecoveryPointOwner``."""

    def __init__(self, directory: Path, segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        directory.mkdir(parents=True, exist_ok=True)
        finish_interrupted_swaps(directory)
        self.segments: list[Segment] = list_segments(directory)
        self.next_offset = 0
        self.durable_offset = 0
        self._fd: int | None = None
        # the durable end: base offset of the segment it lies in, and that segment's durable size
        self._durable_base = -1
        self._durable_size = 0
        # the end known on disk (fsynced or syncfs'd): the same as the durable end, except with a
        # journal, where the durable end is what the journal holds and this one lags until a checkpoint
        self.synced_offset = 0
        self._synced_base = -1
        self._synced_size = 0
        self._dir_dirty = False
        self._checkpointed_at = 0.0
        self._claim_lock = claim_lock(directory)
        self.recovered = False  # the durable bookkeeping is only meaningful after recover()
        # storage.journal: every append also goes there (set by the runtime for its partition logs)
        self.journal: Journal | None = None
        self.partition = -1
        self.journaled_end: LogEnd = (0, -1, 0)  # where the appends written to the journal end
        self._journaling = True
        self.refused = False  # its appends not yet in the journal will never be acknowledged (storage.journal)

    # -- reading -------------------------------------------------------------------------------

    def recover(self, replayable: bool = False) -> Iterator[Batch]:
        """Reads every batch from the start. Damage past the recovery point that looks like a torn
        write (nothing valid after it in its segment) is cut aside together with any newer segments,
        as a crash between an append and its fsync leaves it; damage anywhere else raises
        LogCorruptError. Afterwards what was read is fsynced (a killed process leaves unsynced bytes
        in the page cache) and only then counted durable."""
        self.close()
        self.recovered = False
        self.segments = list_segments(self.directory)  # a retry after a failed recovery starts afresh
        earlier = {path.name for path, _ in aside_files(self.directory)}
        claim = known_base, known_position = self.recorded_claim()
        if known_base < 0 and os.path.lexists(self.directory / RECOVERY_POINT):
            # Logged here, once per load, not by every reader of the claim (the recorder reads it too).
            log.warning("%s is unreadable: recovering as if the log had no recovery point (everything past "
                        "the first segment's start may be cut as a torn tail)", self.directory / RECOVERY_POINT)
        if self.journal is not None:
            self.journal.recovering(self.partition)
        run = self._journal_run()
        rewrite_from = batch_offsets(run[0])[0] if run else None
        # Acknowledged batches the log must hold: all before the journal's run (a checkpoint synced them
        # before it deleted their journal segments), all the last checkpoint synced (the journal's
        # synced-ends entry: a partition idle since has no run), and all a failed partition's journal
        # copy holds (its journal no longer does). Damage below them is corruption, however recent the
        # recovery point.
        try:
            kept_to, kept = kept_journal_end(self.directory)
        except ValueError as exc:  # a damaged copy: what the log must reach is unknown
            raise LogCorruptError(str(exc)) from exc
        synced_to = self.journal.synced_end(self.partition) if self.journal is not None else -1
        must_reach, held_by = max((rewrite_from if rewrite_from is not None else -1,
                                   f"the journal continues from {rewrite_from}"),
                                  (synced_to, "the journal's last checkpoint synced them"), (kept_to, kept))
        rewrite_at: tuple[int, int] | None = None  # (segment index, byte position) where the run goes
        self.next_offset = self.segments[0].base_offset if self.segments else 0
        ended_at = 0  # byte where the previous segment's last batch ends
        for i, seg in enumerate(self.segments):
            if rewrite_from is not None and i > 0 and self.next_offset == rewrite_from < seg.base_offset:
                # The run starts where the previous segment ends, and this one begins past that: rolled to
                # after batches a power cut then took from the previous one (its directory entry made
                # durable by a sync of another file, its own bytes empty or only some). The run goes on
                # the previous segment; this one and any later are cut (aside, unless the run holds them).
                rewrite_at = (i - 1, ended_at)
                break
            self.next_offset = max(self.next_offset, seg.base_offset)
            damage = None
            position = 0
            for item in read_segment(seg.path, replayable=replayable):
                if isinstance(item, Damage):
                    damage = item
                    break
                if item.base_offset < self.next_offset:  # a batch repeated or out of order
                    damage = Damage(position, f"batch offset {item.base_offset} below expected {self.next_offset}",
                                    torn=False)
                    break
                if rewrite_from is not None and item.last_offset >= rewrite_from:
                    if item.base_offset < rewrite_from:
                        raise LogCorruptError(f"{seg.path} at byte {position}: batch [{item.base_offset}, "
                                              f"{item.last_offset}] spans the journal's first offset {rewrite_from}")
                    if self.next_offset < rewrite_from < item.base_offset:
                        # The log jumps over where the run starts: not where it goes, but damage (a batch's
                        # base offset, which its CRC does not cover, changed), judged as any other. Taken
                        # for the run's place, every batch from here on was replaced by the run.
                        damage = Damage(position, f"batch offset {item.base_offset} past the journal's first "
                                        f"{rewrite_from}, expected {self.next_offset}", torn=False)
                        break
                    rewrite_at = (i, position)
                    break
                if self.next_offset < must_reach <= item.last_offset and item.base_offset > self.next_offset:
                    # A gap before a batch reaching what the log must hold. Appends leave none, and the
                    # cleaner compacts no segment at or past the synced end: a base offset changed (its CRC
                    # does not cover it), and the batch after it, "below expected", read as a torn tail.
                    damage = Damage(position, f"batch offset {item.base_offset} past expected {self.next_offset}, "
                                    f"below {must_reach} ({held_by})", torn=False)
                    break
                self.next_offset = item.last_offset + 1
                position += item.size
                yield item
            if rewrite_at is not None:
                break
            if damage is None:
                ended_at = position
                continue
            if rewrite_from is not None and self.next_offset == rewrite_from:
                # Damage where the journal's run starts (a rewrite torn by a crash, or cut short by a full
                # disk): the run replaces it. Cut aside, or served read-only from before it, it would be
                # acknowledged commits missing.
                rewrite_at = (i, damage.position)
                break
            known_durable = seg.base_offset < known_base or (
                seg.base_offset == known_base and damage.position < known_position
            )
            if known_durable:
                raise LogCorruptError(f"{seg.path} at byte {damage.position}: {damage.reason}")
            if self.next_offset < must_reach:
                # Not a torn write: raised before anything is cut, so the log stays as found for the repair
                # (cut, it ended short, and served so once its journal was gone).
                raise LogCorruptError(f"{seg.path} at byte {damage.position}: {damage.reason}; the batches from "
                                      f"offset {self.next_offset} to {must_reach - 1} were acknowledged and synced "
                                      f"({held_by})")
            try:
                cut_aside(seg, damage.position, f"damaged tail past the recovery point ({damage.reason})")
            except OSError as exc:
                # No room (or no write access) to keep the tail aside: serve what precedes it, read-only,
                # once it is on disk (a killed process may have left it in the page cache only).
                self._sync_before_serving()
                raise TailNotCut(f"{seg.path} at byte {damage.position}: {damage.reason}; it cannot be set "
                                 f"aside now ({exc.strerror or exc})") from exc
            for later in self.segments[i + 1 :]:
                set_aside(later, "written after a torn write")
            del self.segments[i + 1 :]
            break
        sync_from = known_base
        if rewrite_from is not None:
            # Whether the log and the run could be served from here should writing the run fail: only
            # if, written, they would pass the recovery point's check below.
            servable = run_reaches(self.segments, claim, rewrite_at, run)
            if rewrite_at is not None:
                try:
                    self._clear_for_run(rewrite_at[0], rewrite_at[1], run)
                except OSError as exc:
                    yield from self._served_from_journal(run, run, exc, servable, replayable)
            elif self.next_offset != rewrite_from:
                raise LogCorruptError(f"{self.directory}: the log ends at offset {self.next_offset} and its journal "
                                      f"continues from {rewrite_from}: acknowledged batches are missing")
            sync_from = min(known_base, self.segments[-1].base_offset if self.segments else rewrite_from)
            yield from self._append_run(run, servable, replayable)
        # After the run, if there is one, not before: a crash between a cut and its rewrite leaves the log
        # short of a claim an earlier recovery recorded, and the journal still holds what brings it back.
        if (short := short_of(self.segments, claim)) is not None:
            raise LogCorruptError(f"{self.directory}: {short}")
        if self.next_offset < synced_to:
            raise LogCorruptError(f"{self.directory}: the log holds offsets below {self.next_offset} only, and the "
                                  f"journal's last checkpoint synced it through offset {synced_to - 1}: acknowledged "
                                  f"batches are missing")
        if self.next_offset < kept_to:
            # The partition failed, and its journal stopped keeping its batches: the copy is what says so.
            raise LogCorruptError(f"{self.directory}: the log ends at offset {self.next_offset} and {kept}, kept "
                                  f"from the journal when the partition failed, says it held offsets to "
                                  f"{kept_to - 1}: acknowledged batches are missing (repair the log, or remove "
                                  f"the file to accept their loss)")
        for seg in self.segments:
            if seg.base_offset >= sync_from:
                fsync_path(seg.path)
        fsync_path(self.directory)
        self._mark_durable()
        self._mark_synced()
        self.journaled_end = self.end()
        self.recovered = True
        if self.journal is not None:
            self.journal.applied(self.partition)
        try:
            self.checkpoint()
        except OSError as exc:  # a read-only directory can still be served; the claim is just not recorded
            log.warning("%s: could not record the recovery point (%s); the log is intact", self.directory,
                        exc.strerror or exc)
        try:
            prune_aside(self.directory, earlier)
        except OSError as exc:  # they stay until a later recovery: nothing the log needs
            log.warning("%s: could not remove old files of bytes set aside (%s)", self.directory, exc.strerror or exc)

    def _journal_run(self) -> list[bytes]:
        """This partition's batches in the journal that the log may not hold (storage.journal). A gap in
        them fails the partition, even where the log seems to hold what is missing within its recovery
        point: a recovery killed inside its rewrite leaves the log cut there (a review's counterexample,
        tests/storage/test_journal.py)."""
        if self.journal is None:
            return []
        try:
            return resolve(self.journal.entries_for(self.partition))
        except JournalError as exc:
            raise LogCorruptError(f"{self.directory}: {exc}") from exc

    def _clear_for_run(self, index: int, position: int, run: list[bytes]) -> None:
        """Makes room for the journal's run at segment ``index``'s byte ``position``
        (storage.journalentries ``clear_for_run``)."""
        clear_for_run(self.segments, index, position, run)
        self.next_offset = batch_offsets(run[0])[0]

    def _append_run(self, run: list[bytes], servable: bool, replayable: bool) -> Iterator[Batch]:
        """Writes the journal's run at the log's end (not journaled again: it is there already) and
        yields its batches, as read from the log would be."""
        self._journaling = False
        try:
            for i, batch in enumerate(run):
                try:
                    self.append(batch, batch_offsets(batch)[1])
                except OSError as exc:
                    yield from self._served_from_journal(run, run[i:], exc, servable, replayable)
                yield decode_batch(batch, replayable)
        finally:
            self._journaling = True
            self.close()

    def _served_from_journal(self, run: list[bytes], rest: list[bytes], exc: OSError, servable: bool,
                             replayable: bool) -> Iterator[Batch]:
        """``rest``, the run's batches not yet written over the log, read from the journal instead,
        then RunNotWritten: a full disk costs the partition its writes, not its reads. Only once what
        is served is on disk (the log's part and the journal segments an earlier process left, which
        it may not have synced), and not at all (``exc`` is raised: the partition retries) when the
        recovery point's check would fail once the run is written. The journal's probe then waits for
        room for the whole run, so the partition does not reload until it fits."""
        if not servable:
            raise exc
        self._sync_before_serving()
        if self.journal is not None:
            self.journal.sync_left_over()
            self.journal.needs_bytes = max(self.journal.needs_bytes, sum(len(b) for b in run))
        for batch in rest:
            yield decode_batch(batch, replayable)
        raise RunNotWritten(f"{self.directory}: the journal's batches from offset {batch_offsets(run[0])[0]} on "
                            f"cannot be written into the log now ({exc.strerror or exc}); they are read from the "
                            f"journal, which keeps them") from exc

    def _sync_before_serving(self) -> None:
        """Every segment fsynced (raises OSError): a recovery that cannot finish serves what it read
        only once a power cut cannot take it back. One a rewrite that failed half-way removed serves
        nothing."""
        fsync_existing(seg.path for seg in self.segments)

    def read_durable(self, replayable: bool = False) -> Iterator[Batch]:
        """The batches below ``durable_offset``, read without writing anything: how a partition whose
        unacknowledged tail cannot be cut (a file system gone read-only) still serves what was
        acknowledged. Only valid after ``recover()``."""
        if not self.recovered:
            raise RuntimeError(f"{self.directory}: read_durable before recover()")
        for seg in self.segments:
            if seg.base_offset >= self.durable_offset:
                return
            for item in read_segment(seg.path, replayable=replayable):
                if isinstance(item, Damage):
                    if item.position < (seg.size if seg.base_offset < self._durable_base else self._durable_size):
                        raise LogCorruptError(f"{seg.path} at byte {item.position}: {item.reason}")
                    break
                if item.base_offset >= self.durable_offset:
                    return
                yield item

    # -- writing -------------------------------------------------------------------------------

    def append(self, batch: bytes, last_offset: int) -> None:
        """Appends one encoded batch (already stamped with its offsets); not durable until ``sync``."""
        active = self.segments[-1] if self.segments else None
        if active is None or (active.size > 0 and active.size + len(batch) > self.segment_bytes):
            base, _ = read_head(batch, 0)
            active = self._roll(base)
        fd = self._fd if self._fd is not None else self._active_fd()
        written = os.write(fd, batch)  # a short write then ENOSPC leaves bytes: count them first
        active.size += written
        if written < len(batch):  # the rest, a view at a time (rare: no view made for the usual write)
            view = memoryview(batch)[written:]
            while view:
                written = os.write(fd, view)
                active.size += written
                view = view[written:]
        self.next_offset = last_offset + 1
        if self.journal is not None and self._journaling:
            self.journal.add(self, self.partition, batch, (self.next_offset, active.base_offset, active.size))

    def sync(self, checkpoint: bool = True) -> None:
        """Makes everything appended durable: fsync the segments written since the last sync, then
        the directory if a segment was created (``checkpoint``: as for ``synced``)."""
        self.fsync_files()
        self.synced(checkpoint)

    def fsync_files(self) -> None:
        """The fsyncs ``sync`` needs; storage.sync replaces them by one syncfs for many logs at once."""
        for seg in self.segments[:-1]:
            if seg.base_offset >= self._synced_base:
                fsync_path(seg.path)
        if self._fd is not None:
            os.fsync(self._fd)
        if self._dir_dirty:
            fsync_path(self.directory)

    def sync_fd(self) -> int | None:
        """The one descriptor whose fsync makes everything appended durable (storage.synchelper syncs
        it from another process), or None when ``sync`` needs more: a segment or a directory entry
        created since the last sync."""
        if self._dir_dirty or self._fd is None or not self.segments or \
                self.segments[-1].base_offset != self._synced_base:
            return None
        return self._fd

    def end(self) -> LogEnd:
        """Where the appends end now: what a sync started now makes durable (``synced``'s ``upto``)."""
        return (self.next_offset, self.segments[-1].base_offset, self.segments[-1].size) if self.segments \
            else (self.next_offset, -1, 0)

    def fits(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more go into the active segment without a new one (whose directory entry
        a sync of the active segment's descriptor would not cover)."""
        return bool(self.segments) and self.segments[-1].size + nbytes <= self.segment_bytes

    def synced(self, checkpoint: bool = True, upto: LogEnd | None = None) -> None:
        """Everything appended (or, with ``upto``, everything up to that ``end()``, taken before the
        sync started: appends may go on while the sync helper syncs) is on disk (fsynced, by
        ``fsync_files`` or a syncfs of its file system): advance the durable end and, with
        ``checkpoint``, record it at most once a second (storage.sync records many logs' at once
        instead)."""
        self._dir_dirty = False
        self._mark_durable(upto)
        self._mark_synced(upto)
        if checkpoint and self.checkpoint_due():
            try:
                self.checkpoint()
            except OSError as exc:
                self.checkpoint_failed(exc)

    def durable_end(self) -> LogEnd:
        return (self.durable_offset, self._durable_base, self._durable_size)

    def abandon_journal(self) -> "KeptAside | None":
        """The log is corrupt (loader thread): see storage.journal ``abandon``."""
        return self.journal.abandon(self.partition, self.directory) if self.journal is not None else None

    def journaled(self, upto: LogEnd) -> None:
        """The journal holds everything appended up to ``upto`` (an ``end()``), durably: that much may
        be acknowledged. The log's own bytes reach the disk at the next checkpoint (``disk_synced``)."""
        self._mark_durable(upto)

    def disk_synced(self, upto: LogEnd) -> None:
        """A checkpoint's syncfs made everything appended up to ``upto`` durable in the log itself.
        Ignored for an end the log no longer reaches (cut back to its durable end since)."""
        if self._would_mark(upto):
            self._mark_synced(upto)

    def acknowledged_end(self) -> LogEnd:
        """Where the appends both in the journal and durable there end: what a checkpoint may mark synced
        (a batch whose journal sync is still under way, or will fail, must not count)."""
        return min(self.journaled_end, self.durable_end())

    def disk_behind(self) -> bool:
        """A checkpoint taken now would mark more of the log synced (``disk_synced``): bytes journaled
        and acknowledged past the last mark. So a checkpoint that ran while their journal sync was in
        flight (and could not count them) is followed by another, though nothing more is journaled."""
        return self._would_mark(self.acknowledged_end())

    def _would_mark(self, upto: LogEnd) -> bool:
        synced = (self.synced_offset, self._synced_base, self._synced_size)
        return self.recovered and upto <= self.end() and upto > synced

    def checkpoint_due(self) -> bool:
        return self._synced_base >= 0 and time.monotonic() - self._checkpointed_at >= CHECKPOINT_INTERVAL_S

    def checkpoint_failed(self, exc: OSError) -> None:
        # The data is durable already; the claim is an optimisation. Failing the batch for it (out of
        # file descriptors, say) would fail commits that are on disk. Try again after the interval.
        self._checkpointed_at = time.monotonic()
        log.warning("%s: could not record the recovery point (%s)", self.directory, exc.strerror or exc)

    def truncate_to_durable(self) -> None:
        """Undoes appends that never became durable (after a failed write or fsync). These bytes were
        written by this process and acknowledged to nobody, so they are dropped, not copied: that works
        on a full disk and gives the space back. Sizes come from the files themselves, so a short write
        before an error is cut too. Reopens the active segment on the next append."""
        if not self.recovered:
            raise RuntimeError(f"{self.directory}: truncate_to_durable before recover()")
        self.close()
        dropped = 0
        while len(self.segments) > 1 and self.segments[-1].base_offset > self._durable_base:
            seg = self.segments.pop()
            if seg.path.exists():
                dropped += seg.path.stat().st_size
                seg.path.unlink()
        if self.segments:
            seg = self.segments[-1]
            actual = seg.path.stat().st_size if seg.path.exists() else 0
            if actual > self._durable_size:
                with open(seg.path, "r+b") as f:
                    f.truncate(self._durable_size)
                    os.fsync(f.fileno())
                dropped += actual - self._durable_size
            seg.size = self._durable_size
        fsync_path(self.directory)
        self.next_offset = self.durable_offset
        if (self.synced_offset, self._synced_base, self._synced_size) > self.end():
            self._mark_synced()
        if dropped:
            log.warning("%s: dropped %d bytes appended after the durable end (offset %d); none was acknowledged",
                        self.directory, dropped, self.durable_offset)

    def probe(self) -> None:
        """Raises OSError unless a small file can be created, written and fsynced in the directory, and
        the active segment opened for appending: how a partition that failed to write finds out that
        space or permission is back (a segment that cannot be opened, in a writable directory, failed
        every commit with a reload each, unthrottled, before it was checked here)."""
        probe = self.directory / PROBE_FILE
        try:
            with open(probe, "wb") as f:
                f.write(b"\0" * PROBE_BYTES)
                f.flush()
                os.fsync(f.fileno())
            if self.journal is not None:  # while this probe still holds its space
                self.journal.probe(PROBE_BYTES)
        finally:
            probe.unlink(missing_ok=True)
        if self.segments and self.segments[-1].path.exists():
            os.close(os.open(self.segments[-1].path, os.O_WRONLY | os.O_APPEND))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    # -- internals -----------------------------------------------------------------------------

    def _roll(self, base_offset: int) -> Segment:
        self.close()
        seg = Segment(base_offset, self.directory / segment_name(base_offset), 0)
        if seg.path.exists():
            # A leftover of a failed append at this offset: keep it aside, start clean.
            set_aside(Segment(base_offset, seg.path, seg.path.stat().st_size), "stale segment")
        # Created before it is listed, as Kafka opens a segment before adding it: a segment listed
        # without a file (its open failed: EMFILE) was synced and recorded as the recovery point at a
        # clean stop, and the next start failed the partition, "segments were removed" (a fault campaign's find).
        self._fd = _open_to_append(seg.path)
        self.segments.append(seg)
        self._dir_dirty = True
        return seg

    def _active_fd(self) -> int:
        if self._fd is None:
            path = self.segments[-1].path
            self._fd = _open_to_append(path)
        return self._fd

    def _mark_durable(self, upto: LogEnd | None = None) -> None:
        self.durable_offset, self._durable_base, self._durable_size = upto if upto is not None else self.end()

    def _mark_synced(self, upto: LogEnd | None = None) -> None:
        self.synced_offset, self._synced_base, self._synced_size = upto if upto is not None else self.end()


def _open_to_append(path: Path) -> int:
    """The active segment's descriptor, the file created if need be."""
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
