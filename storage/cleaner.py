"""The log cleaner: key-based compaction of one ``__consumer_offsets`` partition (reference section 10).

Kafka's LogCleaner, cut down for a single node:

* Only closed segments that are wholly durable, and not the segment the durable end lies in, are
  rewritten: the active segment and anything not yet fsynced belong to the writer's bookkeeping
  (``truncate_to_durable`` must still be able to undo them).
* A record is obsolete when a newer *durable* record with the same key bytes exists anywhere later in
  the log, the active segment included. Non-durable records are ignored: a failed fsync may still take
  them back, and the record they would hide must then be there.
* A tombstone that is the newest for its key stays for ``delete_retention_ms`` after its batch was first
  cleaned. Kafka stores that deadline (the delete horizon) in the batch's baseTimestamp with attribute
  bit 6; record timestamp deltas are then relative to the horizon, so record timestamps are unchanged.
* Transactional and control batches are copied as they are. Their records do not hide older ones (the
  transaction may be aborted), and a tombstone for a key such a batch wrote earlier is never dropped:
  on replay it is what cancels the copied records.
* Offsets never change: a rewritten batch keeps its base offset and every record its offset delta, so
  gaps appear. Rewritten batches are uncompressed; unchanged batches are copied byte for byte.
* Consecutive cleaned segments are merged while the output stays within ``segment_bytes``.

Crash safety (names shared with storage.log): a group's output goes to ``<base>.log.cleaned`` and is
fsynced, renamed to ``<base>-<end>.swap`` (directory fsynced: from here on the swap wins), the originals
are deleted (directory fsynced), and the swap becomes ``<base>.log``. Opening a PartitionLog finishes or
discards whatever a crash interrupted (``finish_interrupted_swaps``).

Where the last compaction ended is kept in ``<log dir>/cleaner-offset`` (Kafka's
cleaner-offset-checkpoint), so a restart does not count a log compacted before it as dirty and
compact it whole again (the first look after every start re-read a 166 MB log of live keys, ~4 s of
CPU beside the event loop, to keep every byte). It only decides when to compact, never what is
dropped: a missing, unreadable or impossible one counts the whole log as dirty, as before.
"""

import functools
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from storage.batch import DELETE_HORIZON_FLAG, Batch, LogRecord, rebuild_batch
from storage.log import LogCorruptError, PartitionLog
from storage.segments import Damage, Segment, fsync_path, read_segment, segment_name, swap_name

MAX_SEGMENT_OFFSETS = 2**31 - 1  # Kafka's indexes hold offsets relative to the segment base as int32
CLEANER_OFFSET = "cleaner-offset"

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CleanStats:
    """What one ``clean`` did; ``clean_end_offset`` is where the next run's dirty part starts."""

    segments_before: int
    segments_after: int
    bytes_before: int
    bytes_after: int
    records_kept: int
    records_dropped: int
    clean_end_offset: int
    # the latest delete horizon among the tombstones the cleaned segments keep until it passes; None:
    # they keep none that a later pass could drop (those kept for good, by the transactional rule or
    # for want of a key, are not counted)
    tombstone_horizon_ms: int | None = None


@dataclass(slots=True)
class _KeyMap:
    newest: dict[bytes, int]  # key -> offset of its newest durable non-transactional record
    txn_first: dict[bytes, int]  # key -> offset of its first record in a transactional batch


class CleanAborted(Exception):
    """``stop()`` asked the cleaner to give up (shutdown); nothing live was changed by the step cut short."""


def cleanable_count(log: PartitionLog) -> int:
    """How many leading segments ``clean`` may rewrite: those followed by a segment that starts below
    the ``compaction_horizon``, which keeps out the active segment and the one the horizon lies in
    (with a journal, the batches a restart may write again from it start there: storage.journal)."""
    return _cleanable(list(log.segments), compaction_horizon(log))


def compaction_horizon(log: PartitionLog) -> int:
    """How far the cleaner may look: the log's synced end, and with a journal no further than the synced
    end it holds for the log (storage.journal ``synced_end``), which can lag (a synced-ends entry that
    could not be written, a start before its first checkpoint). Recovery takes a gap before a batch
    reaching that end for damage (storage.log ``recover``): a compaction past it made a healthy log read
    as damaged (a review's find)."""
    horizon = log.synced_offset
    if log.journal is not None and (held := log.journal.synced_end(log.partition)) >= 0:
        horizon = min(horizon, held)
    return horizon


def _cleanable(segs: list[Segment], durable_offset: int) -> int:
    n = 0
    while n + 1 < len(segs) and segs[n + 1].base_offset < durable_offset:
        n += 1
    return n


def dirty_ratio(log: PartitionLog, clean_end_offset: int) -> float:
    """Share of cleanable bytes at or after ``clean_end_offset`` (the last run's, or 0 after a restart).
    Kafka cleans a log once this reaches ``min.cleanable.dirty.ratio`` (0.5)."""
    closed = log.segments[: cleanable_count(log)]
    total = sum(s.size for s in closed)
    dirty = sum(s.size for s in closed if s.base_offset >= clean_end_offset)
    return dirty / total if total else 0.0


class CleanRecord(NamedTuple):
    """What the last compaction before this start recorded: where it ended (``clean_end``, 0 for none),
    and for the pass kcoord makes for tombstones whose delete horizon passed (``Compactor``): the log's
    synced end it saw, the latest horizon of the tombstones it kept, and when it ran (None: unknown)."""

    clean_end: int = 0
    cleaned_to: int | None = None
    horizon_ms: int | None = None
    cleaned_at_ms: int | None = None


def recorded_clean(plog: PartitionLog) -> CleanRecord:
    """The record of the last compaction before this start, or none (the whole log dirty) when none is
    recorded or it is past the active segment's start (the log was cut or replaced since), which Kafka's
    cleaner also resets to the log's start. A record of only the clean end (as first written) is read."""
    path = plog.directory / CLEANER_OFFSET
    try:
        fields = path.read_text().split()
        offset = int(fields[0])
        rest = [int(f) for f in fields[1:4]]
    except FileNotFoundError:
        return CleanRecord()
    except (OSError, ValueError, IndexError) as exc:
        log.warning("%s is unreadable (%s): the whole log counts as dirty", path, exc)
        return CleanRecord()
    active = plog.segments[-1].base_offset if plog.segments else 0
    if not 0 <= offset <= active:
        log.warning("%s says %d, past the active segment's start %d: the whole log counts as dirty", path,
                    offset, active)
        return CleanRecord()
    if len(rest) < 3:
        return CleanRecord(offset)
    cleaned_to, horizon, at = rest
    # a synced end past the log's (cut since) is not believed: the log then counts as written since
    return CleanRecord(offset, cleaned_to if 0 <= cleaned_to <= plog.synced_offset else None,
                       horizon if horizon >= 0 else None, at if at >= 0 else None)


def record_clean(plog: PartitionLog, record: CleanRecord) -> None:
    """Records a compaction. Not fsynced: a file a crash leaves empty or torn reads as none."""
    tmp = plog.directory / (CLEANER_OFFSET + ".tmp")
    horizon = -1 if record.horizon_ms is None else record.horizon_ms
    cleaned_to = -1 if record.cleaned_to is None else record.cleaned_to
    at = -1 if record.cleaned_at_ms is None else record.cleaned_at_ms
    try:
        tmp.write_text(f"{record.clean_end} {cleaned_to} {horizon} {at}\n")
        os.replace(tmp, plog.directory / CLEANER_OFFSET)
    except OSError as exc:  # a full disk: the next start compacts the log whole, as without the record
        log.warning("%s: could not record where compaction ended (%s)", plog.directory, exc.strerror or exc)
        tmp.unlink(missing_ok=True)


def _run_here(swap: Callable[[], None]) -> None:
    swap()


def clean(
    log: PartitionLog,
    now_ms: int,
    delete_retention_ms: int,
    swap_in: Callable[[Callable[[], None]], None] = _run_here,
    stop: Callable[[], bool] = lambda: False,
) -> CleanStats:
    """Compacts the cleanable segments of ``log`` (recovered) and updates ``log.segments``.

    The slow part only reads closed segments (immutable) and the log up to a snapshot of its durable
    offset, and writes ``.cleaned`` files, so it may run beside the writer. Each swap, the only step
    that changes live files and ``log.segments``, is handed to ``swap_in``, which runs it where the
    log's owner serialises it with appends (and may refuse by raising). ``stop()`` is polled between
    batches. If a swap raises, reopen the log: opening completes or discards an unfinished swap."""
    durable = compaction_horizon(log)  # on disk in the log itself (with a journal, the durable end runs ahead)
    snap = list(log.segments)
    count = _cleanable(snap, durable)
    if count == 0:
        start = snap[0].base_offset if snap else 0
        return CleanStats(0, 0, 0, 0, 0, 0, start)
    keys = _build_key_map(snap, count, durable, stop)
    kept = dropped = bytes_after = outputs = 0
    latest_horizon: int | None = None
    i = 0
    while i < count:
        base = snap[i].base_offset
        tmp = log.directory / (segment_name(base) + ".cleaned")
        j, written, changed = i, 0, False
        try:
            with open(tmp, "wb") as out:
                while j < count and (j == i or _fits(log, snap, base, j, written)):
                    for batch, raw in _batches_with_bytes(snap[j]):
                        if stop():
                            raise CleanAborted()
                        data, gone, horizon = _clean_batch(batch, raw, keys, now_ms, delete_retention_ms)
                        if horizon is not None and (latest_horizon is None or horizon > latest_horizon):
                            latest_horizon = horizon
                        kept += len(batch.records) - gone
                        dropped += gone
                        changed = changed or data is not raw
                        if data is not None:
                            out.write(data)
                            written += len(data)
                    j += 1
                if j - i > 1 or changed:
                    out.flush()
                    os.fsync(out.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        outputs += 1
        bytes_after += written
        if j - i == 1 and not changed:
            tmp.unlink()  # nothing to gain: keep the original file
        else:
            try:
                swap_in(functools.partial(_swap, log, snap[i:j], snap[j].base_offset, tmp, written))
            except Exception:
                tmp.unlink(missing_ok=True)  # still there only if the swap was refused or failed early
                raise
        i = j
    before = sum(s.size for s in snap[:count])
    return CleanStats(count, outputs, before, bytes_after, kept, dropped, snap[count].base_offset, latest_horizon)


def _fits(log: PartitionLog, snap: list[Segment], base: int, j: int, written: int) -> bool:
    """Whether segment ``j`` may join the output started at ``base``: its uncleaned size is an upper
    bound of what it adds, so the merged file never exceeds ``segment_bytes``."""
    return written + snap[j].size <= log.segment_bytes and snap[j + 1].base_offset - base <= MAX_SEGMENT_OFFSETS


def _build_key_map(segments: list[Segment], cleanable: int, durable_offset: int,
                   stop: Callable[[], bool]) -> _KeyMap:
    keys = _KeyMap({}, {})
    for i, seg in enumerate(segments):
        for batch in _batches(seg, strict=i < cleanable):
            if stop():
                raise CleanAborted()
            if batch.base_offset >= durable_offset:
                return keys
            if batch.control_type is not None:
                continue
            for r in batch.records:
                if r.key is None:
                    continue
                if batch.is_transactional:
                    keys.txn_first.setdefault(r.key, r.offset)
                else:
                    keys.newest[r.key] = r.offset
    return keys


def _batches(seg: Segment, strict: bool) -> Iterator[Batch]:
    """A segment's batches; damage fails a segment about to be rewritten, elsewhere it just ends the
    scan (fewer known keys only means fewer records dropped)."""
    for item in read_segment(seg.path):
        if isinstance(item, Damage):
            if strict:
                raise LogCorruptError(f"{seg.path} at byte {item.position}: {item.reason}")
            return
        yield item


def _batches_with_bytes(seg: Segment) -> Iterator[tuple[Batch, bytes]]:
    with open(seg.path, "rb") as f:
        for batch in _batches(seg, strict=True):
            yield batch, f.read(batch.size)


def _clean_batch(
    batch: Batch, raw: bytes, keys: _KeyMap, now_ms: int, delete_retention_ms: int
) -> tuple[bytes | None, int, int | None]:
    """``(bytes to write, or None to drop the batch; records dropped; the delete horizon its kept
    tombstones wait for, or None)``; returns ``raw`` itself when the batch stays as it is. A horizon
    already passed is not returned: tombstones still kept then are kept for good (``_retain``), as are
    transactional batches, copied as they are whatever the time."""
    if batch.is_transactional or batch.control_type is not None:
        return raw, 0, None
    horizon = batch.base_timestamp if batch.attributes & DELETE_HORIZON_FLAG else None
    keep = [r for r in batch.records if _retain(r, keys, now_ms, horizon)]
    dropped = len(batch.records) - len(keep)
    if not keep:
        return None, dropped, None
    has_tombstone = any(r.value is None for r in keep)
    if has_tombstone and horizon is None:
        horizon = now_ms + delete_retention_ms
        return rebuild_batch(raw, {r.offset for r in keep}, horizon), dropped, horizon
    kept_horizon = horizon if has_tombstone else None
    waits_for = kept_horizon if kept_horizon is not None and now_ms < kept_horizon else None
    if dropped == 0:
        return raw, 0, waits_for
    return rebuild_batch(raw, {r.offset for r in keep}, kept_horizon), dropped, waits_for


def _retain(r: LogRecord, keys: _KeyMap, now_ms: int, horizon: int | None) -> bool:
    if r.key is None:
        return True  # not compactable; Kafka rejects these on a compacted topic
    if r.value is None and keys.txn_first.get(r.key, r.offset) < r.offset:
        return True  # cancels transactional records that are copied as they are
    if keys.newest.get(r.key, r.offset) > r.offset:
        return False
    return r.value is not None or horizon is None or now_ms < horizon


def _swap(log: PartitionLog, originals: list[Segment], end: int, cleaned: Path, size: int) -> None:
    """Replaces ``originals`` (base offsets in [base, end)) by ``cleaned`` in the order that lets
    ``finish_interrupted_swaps`` complete it after a crash at any step."""
    base = originals[0].base_offset
    if log.recorded_claim()[0] < end:
        # A claim on disk from before these segments closed would, once they are merged into one
        # file, leave most of that durable file past the recovery point, where damage reads as a
        # torn tail and is cut instead of failing the partition. The current claim lies past them.
        try:
            log.checkpoint()
        except OSError as exc:
            log.checkpoint_failed(exc)
    swap = log.directory / swap_name(base, end)
    os.replace(cleaned, swap)
    fsync_path(log.directory)  # the swap is durable: from here on it replaces the originals
    _delete_originals(originals)
    fsync_path(log.directory)  # never let the new <base>.log sit beside an original that came back
    final = log.directory / segment_name(base)
    os.replace(swap, final)
    fsync_path(log.directory)
    at = next(k for k, s in enumerate(log.segments) if s is originals[0])
    log.segments[at : at + len(originals)] = [Segment(base, final, size)]


def _delete_originals(originals: list[Segment]) -> None:
    for seg in originals:
        seg.path.unlink()
