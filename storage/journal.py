"""The write-ahead journal: one file whose fdatasync makes every partition's appends durable.

Why: a flush cycle of 1-partition commits touches ~30-44 partition logs, and making them durable
together costs one ``syncfs`` of their file system (~0.6-1 ms here), which bounded durable commits to
~0.45x the librdkafka mock and their p99 at half the peak to ~3 ms (bench/README.md, 2026-11-27:
a closed loop of syncfs cycles with no CPU spent at all reaches ~106k commits/s; the same cycles into
one file, 216-264k). With the journal each cycle appends its batches to their partition logs as before
(page cache only) *and*, tagged with their partition, to the journal, and only the journal is synced
before the commits are acknowledged. The logs are synced behind, every ``--checkpoint-interval-ms``, by a
*checkpoint* (coordinator.checkpointer): rotate to a new journal segment, ``syncfs`` (every log append
made before the rotation is then on disk), delete the older journal segments. So the journal only
ever holds what the logs may not: the batches appended since the last checkpoint.

Layout: ``<data-dir>/journal/<20-digit sequence>.journal``, each a run of entries::

    length  int32   bytes of the batch
    partition int32
    crc     uint32  CRC-32C of the segment's number (8 bytes), the partition (4) and the batch
    batch   the Kafka v2 record batch exactly as appended to the partition's log (offsets stamped)

A segment ends at its first entry that is not whole and valid (a torn write, zeros): nothing after it
is read. A segment that had a failed write or sync is never appended to again (the next cycle starts
a new one), so an acknowledged entry never sits behind a hole, unless the disk damaged the file since:
the start logs what follows each segment's last valid entry (storage.journalentries ``report_tail``), as
a WARNING with a copy of the file when valid entries follow a damaged one (Kafka's log recovery also
truncates at the first invalid batch, with a warning).

Recovery (storage.log ``recover``): each partition's entries, in journal order, resolve to one run of
consecutive batches (an entry at an offset below the run's end replaces the run from there: the log
was cut back to its durable end after a failed write, and the offsets were written again). The log is
read up to the run's first offset and the run is written over whatever follows, then fsynced:
rewriting even bytes that look the same makes their pages dirty again, so a log page whose writeback
failed (and which the kernel may since have marked clean) reaches the disk this time.
"""

import errno
import logging
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from storage.journalentries import (
    ENTRY_HEADER,
    SYNCED_ENDS,
    batch_offsets,
    entry_crc,
    pack_synced_ends,
    read_entries,
    report_tail,
    segment_name,
    unpack_synced_ends,
)
from storage.segments import fsync_existing, fsync_path, write_aside

if TYPE_CHECKING:
    from storage.log import LogEnd, PartitionLog

log = logging.getLogger(__name__)

JOURNAL_DIR: Final = "journal"
_SEGMENT_RE: Final = re.compile(r"^(\d{20})\.journal$")


def left_over(data_dir: Path) -> int:
    """The batches in ``data_dir``'s journal segments, read without changing anything: what a run in
    journal mode that did not stop cleanly (or stopped with a failed partition) left for the next start
    to write into the logs (a clean stop with every partition serving leaves none; an empty segment made
    ahead holds none; synced-ends entries are not counted)."""
    directory = data_dir / JOURNAL_DIR
    if not directory.is_dir():
        return 0
    return sum(1 for path in sorted(directory.iterdir()) if _SEGMENT_RE.match(path.name)
               for partition, _, _ in read_entries(path) if partition != SYNCED_ENDS)


def left_over_note(data_dir: Path, logs: str = "the logs") -> str | None:
    """What offline readers of ``data_dir``'s logs (kcoord dump-log, the pipeline) say when its journal
    holds batches: their output may lack the newest acknowledged commits, and hold commits never
    acknowledged that the next start sets aside. None when it holds none."""
    left = left_over(data_dir)
    if not left:
        return None
    return (f"{data_dir / JOURNAL_DIR} holds {left} batches that {logs} may lack, and {logs} may hold batches "
            f"never acknowledged (while kcoord runs, or after a crash until it starts again, writes the journal's "
            f"batches in and sets aside what it replaces)")


@dataclass(frozen=True, slots=True)
class KeptAside:
    """What a failed partition's ``abandon`` wrote beside its log (storage.segments ``kept_journal_end``)."""

    batches: Path | None  # journal-batches.<n>.tr: its journal batches
    synced_end: Path | None  # journal-synced-end.<n>.tr: its last checkpoint's synced end, when they end before it


@dataclass(slots=True)
class JournalSegment:
    seq: int
    path: Path
    fd: int | None  # open for appending while live, and until its last sync is done
    size: int  # bytes written
    durable: int  # bytes known on disk (this process: fsynced; at start: the whole file)
    dir_durable: bool  # its directory entry is fsynced
    broken: bool = False  # a write or sync failed: never appended to again
    startup: bool = False  # left by an earlier process: its entries may not be in the logs yet
    synced_ends: int = 0  # bytes of it that are synced-ends entries, not batches


class Journal:
    """The journal of one data directory. Appends, writes and rotation on the event loop; the syncs
    on the sync helper or the writer thread; reading (``entries_for``) from the loader threads."""

    def __init__(self, data_dir: Path) -> None:
        self.directory = data_dir / JOURNAL_DIR
        self.directory.mkdir(exist_ok=True)
        self._pending: list[tuple[PartitionLog, int, bytes, LogEnd]] = []  # log, partition, batch, its end
        self._segments: dict[int, JournalSegment] = {}
        self._startup: dict[int, list[bytes]] = {}
        # Each partition's next offset as the last checkpoint that completed put its log on disk (the
        # synced-ends entries of storage.journalentries): the log must reach it at recovery.
        self._synced_ends: dict[int, int] = {}
        self._marking: dict[int, int] | None = None  # the synced-ends entry of the checkpoint under way
        self._written: dict[int, int] | None = None  # the newest synced-ends entry written
        self._entry_failed = False  # the last one could not be written (said once, until one is)
        self.damaged_segments = 0  # found damaged with valid entries after the damage (report_tail)
        for entry in sorted(self.directory.iterdir()):
            m = _SEGMENT_RE.match(entry.name)
            if not m:
                continue
            size = entry.stat().st_size
            self._segments[int(m.group(1))] = JournalSegment(int(m.group(1)), entry, None, size, size, True, True, True)
            read_to = 0
            for partition, batch, end in read_entries(entry):
                if partition == SYNCED_ENDS:  # each is complete: the newest replaces those before it
                    self._synced_ends = unpack_synced_ends(batch)
                else:
                    self._startup.setdefault(partition, []).append(batch)
                read_to = end
            if read_to < size and report_tail(entry, read_to):
                self.damaged_segments += 1
        # Which batches a partition's recovery needs (``entries_for``), by journal position (segment,
        # byte): a partition's log holds everything journaled before the last checkpoint
        # (``_synced_from``), and before where it last recovered (``_covered``). Partitions in
        # ``unapplied`` may lack more: those with batches left by an earlier process, and after a failed
        # checkpoint every partition, whose log may have lost pages since the last good one. While
        # any is, no segment is deleted.
        self._startup_pending: set[int] = set(self._startup)
        self.unapplied: set[int] = set(self._startup)
        self._covered: dict[int, tuple[int, int]] = {}
        # Partitions recovering now (their log may be cut back, not yet rewritten and fsynced): no
        # segment is deleted meanwhile either. Abandoned ones (corrupt logs) hold nothing.
        self._recovering: set[int] = set()
        self._recovery_lock = threading.Lock()  # ``recovering`` against a checkpoint's ``drop``
        self._abandoned: set[int] = set()
        if self._startup:
            log.info("journal: %d batches of %d partitions to apply to their logs (the process before did not "
                     "stop cleanly)", sum(len(b) for b in self._startup.values()), len(self._startup))
        self.in_flight: JournalSegment | None = None  # the segment a sync in progress syncs
        self.needs_bytes = 0  # the largest write that failed: what ``probe`` checks there is room for
        self._next_seq = max(self._segments, default=0) + 1  # sequence numbers are handed out on the loop
        self._spare: JournalSegment | None = None  # the next live segment, made ahead (``make_spare``)
        self.live = self._create(self._take_seq())
        fsync_path(self.directory)
        self.live.dir_durable = True
        self._synced_from = (self.live.seq, 0)
        self.position = (self.live.seq, 0)  # where the next write goes (set on the loop, read by loaders)

    # -- appending (event loop) -----------------------------------------------------------------

    def add(self, plog: "PartitionLog", partition: int, batch: bytes, end: "LogEnd") -> None:
        """A batch just appended to ``plog`` (partition ``partition``), which then ended at ``end``:
        written to the journal by the next ``write``."""
        self._pending.append((plog, partition, batch, end))

    def write(self) -> tuple[JournalSegment, int]:
        """Writes what was added since the last write to the live segment (a new one after a failure);
        returns the segment and its size, which a sync of it then makes durable. Each log's
        ``journaled_end`` moves to where its journaled appends end. Batches of a log whose writes were
        refused since (``PartitionLog.refused``: set on the loop when its partition fails a write) are
        left out: they were never acknowledged, and must not come back."""
        seg = self.live
        if seg.broken:
            seg = self.rotate_live()
        if self._pending:
            pending, self._pending = self._pending, []
            seq, header = seg.seq, ENTRY_HEADER.pack
            data = b"".join([part for plog, partition, batch, _ in pending if not plog.refused
                             for part in (header(len(batch), partition, entry_crc(seq, partition, batch)), batch)])
            try:
                _append(seg, data)
            except OSError:
                self.needs_bytes = max(self.needs_bytes, len(data))
                raise
            for plog, _, _, end in pending:
                plog.journaled_end = end
            self.position = (seg.seq, seg.size)
        return seg, seg.size

    def plan(self, seg: JournalSegment) -> int | None:
        """The descriptor whose fdatasync makes ``seg`` durable, or None when its directory entry needs
        an fsync too (a segment created since: the writer thread syncs both)."""
        return seg.fd if seg.dir_durable else None

    def sync(self, seg: JournalSegment) -> None:
        """Writer thread: ``seg`` durable, directory entry included."""
        if seg.fd is None:
            raise OSError(errno.EBADF, f"journal segment {seg.path.name} is closed")
        os.fdatasync(seg.fd)
        if not seg.dir_durable:
            fsync_path(self.directory)

    def synced(self, seg: JournalSegment, size: int, error: BaseException | None) -> None:
        """On the loop, after a sync of ``seg`` posted at ``size``: durable that far, or broken."""
        self.in_flight = None
        if error is not None:
            seg.broken = True
        else:
            seg.dir_durable = True
            seg.durable = max(seg.durable, size)
        if seg is not self.live:
            if seg.fd is not None and self._segments.get(seg.seq) is not seg:  # deleted while in flight
                os.close(seg.fd)
                seg.fd = None
            self._close_retired()

    # -- checkpoints (event loop, then a checkpoint thread) -------------------------------------

    def rotate_live(self) -> JournalSegment:
        """A new live segment; the old one is retired (its descriptor closed once no sync uses it)."""
        seg, self._spare = self._spare, None
        if seg is not None and seg.seq < self.live.seq:
            # Reserved before a failed write made a newer live segment: segments are replayed in the
            # order of their numbers, so this one can never be written after it.
            _discard_segment(seg)
            seg = None
        if seg is None:
            seg = self._create(self._take_seq())
        else:
            self._segments[seg.seq] = seg
        self.live = seg
        self.position = (seg.seq, 0)
        self._close_retired()
        return seg

    def rotate(self) -> int:
        """Checkpoint, on the loop: writes go to a new segment from now on; returns its sequence
        number, below which every segment can go once the logs are synced (``droppable``)."""
        if self.live.size > self.live.synced_ends or self.live.broken:
            self.rotate_live()
        return self.live.seq

    def write_synced_ends(self, ends: dict[int, int]) -> None:
        """Checkpoint, on the loop, after ``rotate``: the recovered logs' next offsets as its syncfs is to
        put them on disk (``ends``), in an entry of the live segment, which that syncfs makes durable
        before the older segments go. Why: recovery points are recorded at most every 30 s, and damage
        past one, in a log whose journal batches were gone, read as a torn tail (a fault campaign's find).

        Each entry is complete, the newest replacing those before it: logs loading or reloading keep the
        end known for them, failed ones are left out (``abandon`` keeps theirs beside the log). One that
        the live segment's newest entry says already is not written again. An entry claims more than is
        on disk until the syncfs succeeds, which a start after a crash cannot tell; until it does, the
        journal keeps every batch since the last one that did, which covers the difference. One that
        cannot be written (a full disk) is not waited for: the segments still go, and the next
        checkpoint is due to try again (``entry_due``); holding them kept a full disk full."""
        seg = self.live
        entry = self._complete_entry(ends)
        said_already = seg.synced_ends and seg.size == seg.synced_ends and entry == self._written
        if said_already or self._append_entry(seg, entry):
            self._marking = entry

    def _complete_entry(self, ends: dict[int, int]) -> dict[int, int]:
        """``ends`` over the ends known for the logs not in it, the failed partitions' left out."""
        return {p: e for p, e in (self._synced_ends | ends).items() if p not in self._abandoned}

    def _append_entry(self, seg: JournalSegment, entry: dict[int, int]) -> bool:
        """Writes a synced-ends entry at the end of ``seg`` (not synced); False if it could not be."""
        body = pack_synced_ends(entry)
        data = ENTRY_HEADER.pack(len(body), SYNCED_ENDS, entry_crc(seg.seq, SYNCED_ENDS, body)) + body
        try:
            _append(seg, data)
        except OSError as exc:  # the next write or checkpoint rotates past whatever part of it was written
            if not self._entry_failed:
                log.warning("journal: could not record how far the logs are on disk (%s): until it can, damage the "
                            "disk does to a log's synced tail past its recovery point reads as a torn write at a "
                            "start after a crash", exc.strerror or exc)
            self._entry_failed = True
            return False
        if self._entry_failed:
            log.info("journal: records how far the logs are on disk again")
            self._entry_failed = False
        seg.synced_ends += len(data)
        self._written = entry
        self.position = (seg.seq, seg.size)
        return True

    @property
    def entry_due(self) -> bool:
        """A checkpoint is due for the synced-ends entry alone, though nothing was journaled since: the
        last one could not be written, or names a partition that has failed since (its end is kept beside
        its log, and a claim left in the journal kept failing it after the operator removed that file)."""
        newest = self._written if self._written is not None else self._synced_ends  # a start's: the segments'
        return self._entry_failed or not self._abandoned.isdisjoint(newest)

    def synced_end(self, partition: int) -> int:
        """Loader thread: the next offset ``partition``'s log held on disk at the last checkpoint that
        completed (this process's, or one an earlier process left in its segments); -1 if none."""
        return self._synced_ends.get(partition, -1)

    def reserve_spare(self) -> int:
        """On the loop: the sequence number of the next spare (0: one is ready already)."""
        return 0 if self._spare is not None else self._take_seq()

    def make_spare(self, seq: int, reuse: Path | None = None) -> JournalSegment:
        """Checkpoint thread: segment ``seq``, its directory entry fsynced, so the next rotation's
        first cycle syncs the journal on the sync helper, not on the writer thread (whose GIL
        hand-offs on a busy loop held every commit of that cycle for milliseconds, every checkpoint).
        ``reuse``: a deleted segment's file, renamed to it and overwritten from its start: its blocks
        are allocated and written, so an fdatasync of bytes written over them changes no file size
        and allocates nothing, and skips the file system's journal commit (measured: ~0.11 against
        ~0.16 ms here). Its old entries fail the new number's CRC. Handed to ``adopt_spare`` on the
        loop, which owns the journal's state. On failure the caller must still delete ``reuse``."""
        path = self.directory / segment_name(seq)
        if reuse is not None:
            os.rename(reuse, path)
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        else:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            fsync_path(self.directory)
        except OSError:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        return JournalSegment(seq, path, fd, 0, 0, True)

    def adopt_spare(self, seg: JournalSegment) -> None:
        """On the loop: ``seg`` becomes the next rotation's segment, unless a newer one is live already
        (a failed write rotated meanwhile: segments replay in the order of their numbers)."""
        if self._spare is None and seg.seq > self.live.seq:
            self._spare = seg
        else:
            _discard_segment(seg)

    def droppable(self, boundary: int) -> list[JournalSegment]:
        """The segments a checkpoint at ``boundary`` may delete: those before it, unless some partition
        has yet to recover from them (then none: what such a partition needs is a run without gaps)."""
        if self.holding:
            return []
        return [s for s in list(self._segments.values()) if s.seq < boundary]

    @property
    def holding(self) -> bool:
        """Some partition has yet to recover from the segments kept: none is deleted, and a start after a
        crash now would replay each of them whole, into every partition's log."""
        return bool(self.unapplied or self._recovering)

    def checkpointed(self, boundary: int) -> None:
        """On the loop: a checkpoint's syncfs succeeded; every log holds what segments below
        ``boundary`` hold, and a recovery never needs them again (nor rewrites into what the cleaner
        may compact once a log is synced: storage.cleaner)."""
        self._synced_from = max(self._synced_from, (boundary, 0))
        if self._marking is not None:
            self._synced_ends, self._marking = self._marking, None

    def hold(self, partitions: set[int]) -> None:
        """A checkpoint failed: the logs of ``partitions`` may have lost pages the kernel could not write
        since the last good one, so each recovers from there (rewriting its batches), and no segment is
        deleted until each has."""
        partitions = partitions - self._abandoned
        for partition in partitions:
            self._cover_from_synced(partition)
        self.unapplied |= partitions
        self._written = None  # its page may be among those lost: the next checkpoint writes it again

    def delete(self, paths: list[Path]) -> None:
        """Checkpoint thread: unlinks segment files and makes that durable (a deleted segment that came
        back after a crash would replay batches the logs may since have compacted)."""
        for path in paths:
            path.unlink(missing_ok=True)
        if paths:
            fsync_path(self.directory)

    def drop(self, paths: list[Path]) -> bool:
        """Checkpoint thread, after its syncfs: ``delete``s the segments ``droppable`` named on the loop
        before it, unless a partition began to recover since (``recovering``), in which case all stay
        (False): its log may be cut back for the rewrite of its journal batches, the syncfs may have put
        the cut on disk without the rewrite, and these segments are what bring the rewrite back after a
        crash (a review's find). Decided under the lock ``recovering`` takes."""
        with self._recovery_lock:
            if self.holding:
                return False
            self.delete(paths)
        return True

    def deleted(self, segments: list[JournalSegment]) -> None:
        """On the loop, after ``delete``."""
        for seg in segments:
            self._segments.pop(seg.seq, None)
        if not self.keeps_earlier_segments:
            self._startup.clear()
        self._close_retired()

    @property
    def keeps_earlier_segments(self) -> bool:
        """Segments an earlier process left are still here: a start after a crash now replays them."""
        return any(seg.startup for seg in list(self._segments.values()))

    @property
    def live_size(self) -> int:
        """Bytes of batches in the live segment (its synced-ends entry is not something to checkpoint)."""
        return self.live.size - self.live.synced_ends

    @property
    def retained(self) -> int:
        """Segments not yet deleted, the live one included."""
        return len(self._segments)

    def probe(self, extra: int) -> None:
        """Raises OSError unless a file as large as the largest failed write (plus ``extra``, which
        the caller holds meanwhile: a partition log's probe) can be written and fsynced here. A full
        disk fails the journal write *after* the logs took their copy of the same bytes: probing with
        less space than both need would call it writable and fail the next commit again."""
        probe = self.directory / ".write-probe"
        size = max(self.needs_bytes, extra)
        try:
            with open(probe, "wb") as f:
                f.write(b"\0" * size)
                f.flush()
                os.fsync(f.fileno())
        finally:
            probe.unlink(missing_ok=True)
        self.needs_bytes = 0

    # -- recovery (loader threads) --------------------------------------------------------------

    def entries_for(self, partition: int) -> list[bytes]:
        """``partition``'s batches its log may lack, in journal order: those an earlier process left
        (until applied), then this process's since the last checkpoint or the partition's last recovery
        (whichever is later; for an unapplied partition, since its last recovery), each segment read
        up to where it is known durable (an entry whose sync failed was never acknowledged)."""
        start = self._covered.get(partition, (0, 0))
        if partition not in self.unapplied and partition not in self._recovering:
            start = max(start, self._synced_from)
        batches = list(self._startup.get(partition, ())) if partition in self._startup_pending else []
        for seg in sorted(list(self._segments.values()), key=lambda s: s.seq):
            if seg.startup or seg.durable == 0 or seg.seq < start[0]:
                continue
            try:
                batches.extend(b for p, b, end in read_entries(seg.path, seg.durable)
                               if p == partition and (seg.seq, end) > start)
            except FileNotFoundError:  # deleted by a checkpoint meanwhile: the log has those batches
                continue
        return batches

    def sync_left_over(self) -> None:
        """Loader thread: fsyncs the segments an earlier process left, before batches read from them
        are served without being written into a log first (that process may have been killed between
        a journal write and its sync). Raises OSError."""
        fsync_existing(seg.path for seg in list(self._segments.values()) if seg.startup)  # deleted: in the logs

    def recovering(self, partition: int) -> None:
        """Loader thread, as ``partition``'s recovery starts: no segment is deleted until it has applied
        the batches it reads (its log may be cut back meanwhile, and a checkpoint would sync that),
        and where it reads from stays put until it has: a recovery that failed half-way through its
        rewrite (a full disk) left its log cut short, and its retry must not start after checkpoints
        that synced the cut (a fault campaign lost acknowledged commits so)."""
        with self._recovery_lock:
            self._cover_from_synced(partition)
            self._recovering.add(partition)

    def _cover_from_synced(self, partition: int) -> None:
        """``partition`` recovers from the last checkpoint on, unless it recovers (or has yet to) already:
        then it reads from where it did, as its log may lack more (a rewrite that failed half-way left it
        cut short)."""
        if partition not in self._recovering and partition not in self.unapplied:
            self._covered[partition] = max(self._covered.get(partition, (0, 0)), self._synced_from)

    def abandon(self, partition: int, directory: Path) -> KeptAside:
        """Loader thread: ``partition``'s log is corrupt and it will not serve until repaired. Its journal
        batches are copied next to its log (``journal-batches.<n>.tr``, Kafka v2 batches back to back,
        for the operator's repair), and so is its synced end when they do not reach it
        (``journal-synced-end.<n>.tr``, the offset in decimal): what the log must reach at every start
        (storage.segments ``kept_journal_end``), after the journal stops keeping segments for it (the
        next checkpoints delete them, and the stop writes an entry without it)."""
        batches = self.entries_for(partition)
        batches_copy = _copy_aside(directory, "journal-batches", b"".join(batches)) if batches else None
        synced = self._synced_ends.get(partition, -1)
        synced_copy = None
        if synced > (batch_offsets(batches[-1])[1] + 1 if batches else -1):
            synced_copy = _copy_aside(directory, "journal-synced-end", f"{synced}\n".encode())
        kept = KeptAside(batches_copy, synced_copy)
        self._abandoned.add(partition)
        for held in (self._startup_pending, self.unapplied, self._recovering):
            held.discard(partition)
        return kept

    def applied(self, partition: int) -> None:
        """Loader thread, at the end of ``partition``'s recovery: its log now holds (fsynced) every batch
        journaled so far (it wrote none while recovering), which no later recovery of it needs."""
        self._covered[partition] = self.position
        self._startup_pending.discard(partition)
        self.unapplied.discard(partition)
        self._recovering.discard(partition)
        self._abandoned.discard(partition)

    # -- shutdown -------------------------------------------------------------------------------

    def close(self, remove: bool) -> None:
        """Closes the descriptors; ``remove``: every log is synced and applied, so the journal holds
        nothing they lack, and the next start has nothing to replay. A journal kept whose newest
        synced-ends entry names a partition that failed since gets one without it first (synced): a
        stop before the next checkpoint left that claim to fail the partition again at the next start,
        after the operator had removed the copy beside its log (a fault campaign's find)."""
        if (not remove or self.unapplied) and self.entry_due and not self.live.broken and self.live.fd is not None:
            try:
                if self._append_entry(self.live, self._complete_entry({})):
                    self.sync(self.live)  # its directory entry too, when the segment is new since the last sync
            except OSError as exc:
                log.warning("journal: could not record how far the logs are on disk at the stop (%s)",
                            exc.strerror or exc)
        spare, self._spare = self._spare, None
        if spare is not None:
            _discard_segment(spare)
        for seg in self._segments.values():
            if seg.fd is not None:
                os.close(seg.fd)
                seg.fd = None
        if remove and not self.unapplied:
            try:
                self.delete([seg.path for seg in self._segments.values()])
                self._segments.clear()
            except OSError as exc:
                log.warning("journal: could not remove its segments (%s); the next start replays them",
                            exc.strerror or exc)

    # -- internals ------------------------------------------------------------------------------

    def _take_seq(self) -> int:
        seq = self._next_seq
        self._next_seq += 1
        return seq

    def _create(self, seq: int) -> JournalSegment:
        path = self.directory / segment_name(seq)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        seg = JournalSegment(seq, path, fd, 0, 0, False)
        self._segments[seq] = seg
        return seg

    def _close_retired(self) -> None:
        for seg in self._segments.values():
            if seg.fd is not None and seg is not self.live and seg is not self.in_flight:
                os.close(seg.fd)
                seg.fd = None


def _append(seg: JournalSegment, data: bytes) -> None:
    """Writes ``data`` at the end of ``seg``. Raises OSError, and ``seg`` is then broken: never appended
    to again (whatever part of ``data`` reached it is not an entry to write after)."""
    try:
        if seg.fd is None:
            raise OSError(errno.EBADF, f"journal segment {seg.path.name} is closed")
        view = memoryview(data)
        while view:
            n = os.write(seg.fd, view)
            seg.size += n
            view = view[n:]
    except OSError:
        seg.broken = True
        raise


def _copy_aside(directory: Path, stem: str, data: bytes) -> Path:
    """``data`` in a new ``<stem>.<n>.tr`` beside a failed partition's log, fsynced with its entry; the
    copy an earlier start made when one holds the same (each start fails the partition again while the
    journal keeps what the copy holds)."""
    n = 0
    while (copy := directory / f"{stem}.{n}.tr").exists():
        if copy.read_bytes() == data:
            fsync_path(copy)  # the process that wrote it may have died before its sync
            break
        n += 1
    else:
        write_aside(copy, data)
    fsync_path(directory)
    return copy


def _discard_segment(seg: JournalSegment) -> None:
    if seg.fd is not None:
        os.close(seg.fd)
        seg.fd = None
    seg.path.unlink(missing_ok=True)


