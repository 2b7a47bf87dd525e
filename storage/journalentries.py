"""The journal's entries on disk (storage.journal has the design): their format, reading a segment
back, what follows a segment's last valid entry (``report_tail``), and resolving one partition's
entries to the run of consecutive batches recovery writes into its log (storage.log ``recover``), and
whether what a log holds past that run only continues it (``continued_to``), and making room for the run
in the log (``clear_for_run``).

A checkpoint also writes one *synced-ends* entry (partition ``SYNCED_ENDS``, not a batch: each
partition's next offset as the checkpoint's syncfs put its log on disk, ``pack_synced_ends``) into the
segment it rotates to: the journal always holds, durably, how far each log is known on disk, however
long ago its own recovery point was recorded (storage.log ``recover``)."""

import logging
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import crc32c

from storage.batch import Batch, decode_run
from storage.segments import Segment, aside_path, common_prefix, fsync_path, write_aside

log = logging.getLogger("storage.journal")  # the journal's log lines, wherever they are made
_log_lines = logging.getLogger("storage.log")  # a partition log's (``clear_for_run``)

ENTRY_HEADER: Final = struct.Struct(">iiI")  # length, partition, crc32c
_SEQ_PARTITION: Final = struct.Struct(">qi")
_BASE_OFFSET: Final = struct.Struct(">q")
_LAST_DELTA: Final = struct.Struct(">i")  # at byte 23 of a v2 batch
MAX_ENTRY_BYTES: Final = 1 << 30
# The partition field of a checkpoint's synced-ends entry: no partition's, and its body padded to a batch's
# least length, so a kcoord from before these entries (rolled back to after a crash) reads it as a batch
# of a partition it does not have, and goes on to the batches after it (it then keeps its journal whole,
# waiting for that partition to load: disk, not commits). -1 (its first form) made that kcoord stop
# reading each segment there, and lose every acknowledged batch in it.
SYNCED_ENDS: Final = 0x7FFFFFFF
_FIRST_SYNCED_ENDS: Final = -1  # still read: a journal a kcoord with the first form left at a crash
_SYNCED_END: Final = struct.Struct(">iq")  # partition, next offset
_SYNCED_ENDS_BODY: Final = 72  # at least 61, a whole pair count: (-1, -1) pairs pad it


class JournalError(Exception):
    """A partition's journal entries do not form a run of consecutive offsets (or do not continue its
    log): something acknowledged is missing, and the partition must not serve from a guess."""


def batch_offsets(batch: bytes) -> tuple[int, int]:
    """A v2 batch's base and last offset, from its header."""
    base = _BASE_OFFSET.unpack_from(batch, 0)[0]
    return base, base + _LAST_DELTA.unpack_from(batch, 23)[0]


def segment_name(seq: int) -> str:
    return f"{seq:020d}.journal"


def entry_crc(seq: int, partition: int, batch: bytes) -> int:
    """Over the segment's number too: a recycled segment's old entries never pass for its new ones."""
    crc: int = crc32c.crc32c(batch, crc32c.crc32c(_SEQ_PARTITION.pack(seq, partition)))
    return crc  # typed here: the build type-checks without crc32c installed (setup.py), where it is Any


def _plausible(length: int, partition: int) -> bool:
    """An entry header that could be one: a whole v2 batch's length (61 bytes at least) and a partition,
    or a synced-ends entry's whole pairs."""
    if partition == SYNCED_ENDS:
        return _SYNCED_ENDS_BODY <= length <= MAX_ENTRY_BYTES and length % _SYNCED_END.size == 0
    if partition == _FIRST_SYNCED_ENDS:
        return 0 <= length <= MAX_ENTRY_BYTES and length % _SYNCED_END.size == 0
    return 61 <= length <= MAX_ENTRY_BYTES and partition >= 0


def pack_synced_ends(ends: dict[int, int]) -> bytes:
    """A synced-ends entry's body: (partition, next offset) pairs, padded (``SYNCED_ENDS``)."""
    body = b"".join(_SYNCED_END.pack(partition, offset) for partition, offset in sorted(ends.items()))
    if len(body) < _SYNCED_ENDS_BODY:
        body += _SYNCED_END.pack(-1, -1) * ((_SYNCED_ENDS_BODY - len(body)) // _SYNCED_END.size)
    return body


def unpack_synced_ends(body: bytes) -> dict[int, int]:
    """The pairs of a synced-ends entry's body, without its padding."""
    return {partition: offset for partition, offset in _SYNCED_END.iter_unpack(body) if partition >= 0}


def read_entries(path: Path, limit: int | None = None) -> Iterator[tuple[int, bytes, int]]:
    """A segment's entries in order (partition, batch, the byte the entry ends at; partition
    ``SYNCED_ENDS``: a synced-ends entry's body), up to its first invalid one (or ``limit`` bytes). What
    follows is a torn write, zeros, or a recycled segment's older entries."""
    seq = int(path.name[:20])
    with open(path, "rb") as f:
        buf = f.read() if limit is None else f.read(limit)
    pos, size = 0, len(buf)
    while pos + ENTRY_HEADER.size <= size:
        length, partition, crc = ENTRY_HEADER.unpack_from(buf, pos)
        start = pos + ENTRY_HEADER.size
        if not _plausible(length, partition) or start + length > size:
            break
        batch = buf[start : start + length]
        if entry_crc(seq, partition, batch) != crc:
            break
        pos = start + length
        yield (SYNCED_ENDS if partition == _FIRST_SYNCED_ENDS else partition), batch, pos


def report_tail(path: Path, stop: int) -> bool:
    """Logs what follows a segment's last valid entry (at byte ``stop``), left by an earlier process.
    Zeros, a torn write or entries of the file's earlier use (a recycled segment) are a stop's usual
    leftovers (INFO). Entries of this segment that still pass their CRC after the first invalid one
    mean the file was damaged in its middle: not applied, since a write cut short by a crash can leave
    its later pages on disk without its earlier ones (and was never acknowledged), but if the disk
    damaged it, acknowledged batches are among them: a WARNING naming them (Kafka's level for invalid
    batches its log recovery finds; a power cut's torn write reads the same), and a copy of the file
    (``<segment>.damaged``) for the operator. True in that case (kcoord_journal_damaged_segments)."""
    seq = int(path.name[:20])
    with open(path, "rb") as f:
        buf = f.read()
    rest = memoryview(buf)[stop:]
    if not any(rest):
        log.info("journal: %s ends with %d zero bytes after its last entry (at byte %d)", path.name, len(rest), stop)
        return False
    reason = _entry_problem(buf, stop, seq)
    found = _valid_entries_after(buf, stop, seq)
    if not found:
        log.info("journal: %s: read up to byte %d of %d, where %s (a write the process before did not finish, "
                 "or the file's earlier use)", path.name, stop, len(buf), reason)
        return False
    kept = _keep_damaged(path, buf)
    ranges = "; ".join(f"partition {p}: {n} batch{'es' if n > 1 else ''}, offsets {first}-{last}"
                       for p, (n, first, last) in sorted(found.items()))
    log.warning("journal: %s is damaged at byte %d (%s), yet valid entries of it follow (%s). They are not "
                "applied: entries after a hole are either a write a crash cut short (never acknowledged) or "
                "acknowledged ones the disk damaged since. Where a partition log still holds them (the process "
                "died, the machine kept its power), recovery keeps them aside in .tr files beside the log; "
                "otherwise those commits are lost. %s", path.name, stop, reason, ranges, kept)
    return True


_BATCH_LENGTH: Final = struct.Struct(">i")  # at byte 8 of a v2 batch: its bytes after that field
_MAGIC_AT: Final = ENTRY_HEADER.size + 16  # an entry's batch's magic byte (2), from the entry's start


def _valid_entries_after(buf: bytes, stop: int, seq: int) -> dict[int, tuple[int, int, int]]:
    """Per partition: how many entries of segment ``seq`` pass their CRC after byte ``stop``, and their
    first and last offsets. Found at any byte, not by walking lengths (a damaged header or a zeroed
    block must not hide what follows): a candidate has a v2 magic byte where its batch's would be
    and a batch length agreeing with its entry's length; then its CRC decides."""
    found: dict[int, tuple[int, int, int]] = {}
    magic = buf.find(b"\x02", stop + _MAGIC_AT)
    while magic >= 0:
        at = magic - _MAGIC_AT
        start = at + ENTRY_HEADER.size
        length, partition, crc = ENTRY_HEADER.unpack_from(buf, at)
        if _plausible(length, partition) and start + length <= len(buf) \
                and _BATCH_LENGTH.unpack_from(buf, start + 8)[0] == length - 12:
            batch = buf[start : start + length]
            if entry_crc(seq, partition, batch) == crc:
                base, last = batch_offsets(batch)
                n, first, _ = found.get(partition, (0, base, base))
                found[partition] = (n + 1, first, last)
                magic = buf.find(b"\x02", start + length + _MAGIC_AT)
                continue
        magic = buf.find(b"\x02", magic + 1)
    return found


def _keep_damaged(path: Path, buf: bytes) -> str:
    """A copy of a damaged segment for the operator, ``<segment>.damaged`` (numbered when an earlier
    incident's copy has the name: sequence numbers start again after a clean stop); says where."""
    copy, n = path.with_name(path.name + ".damaged"), 0
    try:
        while copy.exists():
            if copy.read_bytes() == buf:
                return f"The file is kept as {copy}."
            n += 1
            copy = path.with_name(f"{path.name}.{n}.damaged")
        write_aside(copy, buf)
        fsync_path(path.parent)
    except OSError as exc:
        return f"The file could not be copied ({exc.strerror or exc}) and goes at the next checkpoint."
    return f"The file is kept as {copy}."


def _entry_problem(buf: bytes, pos: int, seq: int) -> str:
    """Why the entry at ``pos`` is not a valid one of segment ``seq`` (for the log)."""
    if pos + ENTRY_HEADER.size > len(buf):
        return f"{len(buf) - pos} bytes are left, less than an entry's header"
    length, partition, _ = ENTRY_HEADER.unpack_from(buf, pos)
    if not _plausible(length, partition):
        return f"the entry's header is not valid (length {length}, partition {partition})"
    if pos + ENTRY_HEADER.size + length > len(buf):
        return f"the entry's {length} bytes run past the end of the file"
    return "the entry's CRC does not match"


def resolve(batches: list[bytes]) -> list[bytes]:
    """One partition's journal batches, in journal order, as the run of consecutive batches they leave:
    a batch at an offset below the run's end replaces the run from that offset on (storage.journal's
    docstring). Raises JournalError on a gap or a batch starting inside another."""
    run: list[bytes] = []
    ends: list[tuple[int, int]] = []
    for batch in batches:
        base, last = batch_offsets(batch)
        while ends and ends[-1][0] >= base:
            run.pop()
            ends.pop()
        if ends and ends[-1][1] + 1 != base:
            raise JournalError(f"journal batch at offset {base} does not follow the batch ending at {ends[-1][1]}")
        run.append(batch)
        ends.append((base, last))
    return run


def continued_to(data: bytes, position: int, first_offset: int) -> int | None:
    """The offset after ``data``'s batches from ``position`` on when they are whole, valid and consecutive
    from ``first_offset`` (appends that continued a log past what the journal holds), else None (damage, a
    gap, an older version of offsets the journal's run writes again)."""
    batches: list[Batch] = []
    if position + decode_run(data, position, len(data), False, batches, limit=len(data)) != len(data):
        return None
    expected = first_offset
    for batch in batches:
        if batch.base_offset != expected:
            return None
        expected = batch.last_offset + 1
    return expected


def clear_for_run(segments: list[Segment], index: int, position: int, run: list[bytes]) -> None:
    """Makes room in a partition log (its ``segments``) for the journal's run at segment ``index``'s byte
    ``position``. What the log holds from there is cut; the part that is not the run's own bytes (batches
    never written to the journal, so never acknowledged, or an older version of offsets the run writes
    again) is first kept aside in a ``.tr`` file with a warning. Usually the log holds a prefix of the run,
    and nothing is kept. Each later segment is compared with the run from its own base offset (after a
    power cut, one may hold the run's later batches while the segment before lost its earlier)."""
    seg = segments[index]
    expected = b"".join(run)
    starts: dict[int, int] = {}  # a run batch's base offset -> its byte in ``expected``
    at = 0
    for batch in run:
        starts[batch_offsets(batch)[0]] = at
        at += len(batch)
    with open(seg.path, "rb") as f:
        f.seek(position)
        pieces = [(seg.path, position, f.read(), 0)]
    for later in segments[index + 1 :]:
        pieces.append((later.path, 0, later.path.read_bytes(), starts.get(later.base_offset, -1)))
    follows: int | None = batch_offsets(run[-1])[1] + 1  # where appends past the run would go on
    for path, start, data, expected_at in pieces:
        same = common_prefix(data, expected[expected_at:]) if expected_at >= 0 else 0
        if same < len(data):
            aside = aside_path(path, start + same)
            write_aside(aside, data[same:])
            past_run = expected_at < 0 or same == len(expected) - expected_at
            follows = continued_to(data, same, follows) if past_run and follows is not None else None
            if follows is not None:
                # What a kill -9 usually leaves: appended after the partition's last journal write
                _log_lines.info("%s: %d bytes from byte %d on are batches appended after the journal's last for "
                                "this partition (never journaled, so never acknowledged); kept in %s", path,
                                len(data) - same, start + same, aside.name)
            else:
                _log_lines.warning("%s: %d bytes from byte %d on are not what the journal holds (batches never "
                                   "acknowledged, or an older version of offsets written again), which replaces "
                                   "them; kept in %s", path, len(data) - same, start + same, aside.name)
    with open(seg.path, "r+b") as f:
        f.truncate(position)
    for later in segments[index + 1 :]:
        later.path.unlink()
    del segments[index + 1 :]
    seg.size = position
