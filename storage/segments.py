"""Segment files of a partition log: their names, reading their batches, setting damaged bytes aside
in ``.tr`` files, and finishing what an interrupted compaction swap left (split from storage.log,
which owns a log's durable bookkeeping)."""

import contextlib
import logging
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final

from protocol.hotcodec import int32_at
from storage.batch import (
    BATCH_HEADER_BYTES,
    LAST_DELTA_POSITION,
    LOG_OVERHEAD,
    Batch,
    BatchError,
    decode_batch,
    decode_run,
    read_head,
)

log = logging.getLogger(__name__)

LOAD_BUFFER_BYTES: Final = 5 * 1024 * 1024
# Segment bytes set aside (``aside_path``) kept per partition directory: a recovery removes the oldest
# beyond these (``prune_aside``). Each crash that leaves unacknowledged batches in a log, and each reload
# after a failed journal write, sets some aside, and nothing else ever removed them.
ASIDE_KEPT: Final = 10
_SEGMENT_RE: Final = re.compile(r"^(\d{20})\.log$")
_ASIDE_RE: Final = re.compile(r"^\d{20}\.log\.\d+(?:\.\d+)?\.tr$")
_JOURNAL_COPY_RE: Final = re.compile(r"^journal-batches\.\d+\.tr$")
_SYNCED_END_COPY_RE: Final = re.compile(r"^journal-synced-end\.\d+\.tr$")
_SYNCED_END_TEXT: Final = re.compile(rb"[0-9]+\n")
_SWAP_RE: Final = re.compile(r"^(\d{20})-(\d{20})\.swap$")


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}.log"


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (a directory's fsync makes created/renamed entries durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(slots=True)
class Segment:
    base_offset: int
    path: Path
    size: int


@dataclass(frozen=True, slots=True)
class Damage:
    """Where a segment stops being a sequence of valid batches, and whether that is a torn write."""

    position: int
    reason: str
    torn: bool


def read_segment(path: Path, start: int = 0, replayable: bool = False) -> Iterator[Batch | Damage]:
    """Yields the batches of one segment file in order (see ``decode_batch`` for ``replayable``); ends
    with a Damage if the file does not end on a valid batch. A damage is *torn* when nothing valid can
    follow it: the batch runs past the end of the file, or it is the file's last batch, or only zero
    bytes follow (a preallocated tail)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        f.seek(start)
        buf = b""
        buf_start = start
        pos = start
        while pos < size:
            rel = pos - buf_start
            run: list[Batch] = []
            taken = decode_run(buf, rel, size - buf_start, replayable, run)  # the valid batches, compiled
            if taken:
                yield from run
                pos += taken
                continue
            if len(buf) - rel < LOG_OVERHEAD:
                buf, buf_start, rel = _refill(f, buf, rel, pos, LOAD_BUFFER_BYTES)
            if len(buf) - rel < LOG_OVERHEAD:
                yield Damage(pos, f"{size - pos} bytes too short for a batch header", torn=True)
                return
            _, batch_size = read_head(buf, rel)
            if batch_size < LOG_OVERHEAD + 49:
                torn = _only_zeros(f, pos, size)
                yield Damage(pos, f"batch length {batch_size - LOG_OVERHEAD} is invalid", torn)
                return
            if pos + batch_size > size:
                yield Damage(pos, f"batch of {batch_size} bytes runs past the end of the file", torn=True)
                return
            if len(buf) - rel < batch_size:
                buf, buf_start, rel = _refill(f, buf, rel, pos, max(LOAD_BUFFER_BYTES, batch_size))
            try:
                batch = decode_batch(buf[rel : rel + batch_size], replayable)
            except BatchError as exc:
                yield Damage(pos, str(exc), torn=pos + batch_size == size)
                return
            yield batch
            pos += batch_size


def _refill(f: BinaryIO, buf: bytes, rel: int, pos: int, want: int) -> tuple[bytes, int, int]:
    """Drops consumed bytes and reads until ``want`` bytes from ``pos`` are buffered (or EOF)."""
    rest = buf[rel:]
    chunk = f.read(max(want - len(rest), 0))
    return rest + chunk, pos, 0


def _only_zeros(f: BinaryIO, pos: int, size: int) -> bool:
    f.seek(pos)
    while True:
        chunk = f.read(1 << 20)
        if not chunk:
            return True
        if chunk.count(0) != len(chunk):
            return False


def fsync_existing(paths: Iterable[Path]) -> None:
    """fsyncs each file of ``paths`` that still exists (raises OSError for any other failure)."""
    for path in paths:
        try:
            fsync_path(path)
        except FileNotFoundError:
            continue


def write_aside(path: Path, data: bytes) -> None:
    """Writes ``data`` to a new file ``path`` (bytes kept for an operator: a ``.tr`` file) and fsyncs it;
    a failed attempt leaves no empty or partial copy behind. The directory still needs an fsync."""
    try:
        with open(path, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        path.unlink(missing_ok=True)
        raise


def list_segments(directory: Path) -> list[Segment]:
    segments = []
    for entry in directory.iterdir():
        m = _SEGMENT_RE.match(entry.name)
        if m:
            segments.append(Segment(int(m.group(1)), entry, entry.stat().st_size))
    segments.sort(key=lambda s: s.base_offset)
    return segments


def swap_name(base_offset: int, end_offset: int) -> str:
    return f"{base_offset:020d}-{end_offset:020d}.swap"


def finish_interrupted_swaps(directory: Path) -> None:
    """Completes what a crashed cleaner left: a ``.swap`` is durable and replaces its range; a
    ``.cleaned`` never became a swap and is dropped (the originals are still whole)."""
    for entry in sorted(directory.iterdir()):
        if entry.name.endswith(".cleaned"):
            entry.unlink()
            continue
        m = _SWAP_RE.match(entry.name)
        if not m:
            continue
        base, end = int(m.group(1)), int(m.group(2))
        for seg in list_segments(directory):
            if base <= seg.base_offset < end:
                seg.path.unlink()
        entry.rename(directory / segment_name(base))
        fsync_path(directory)
        log.info("%s: finished an interrupted compaction swap for offsets [%d, %d)", directory, base, end)


def aside_path(segment: Path, position: int) -> Path:
    """``<segment>.<position>.tr``, numbered so an earlier cut at the same place is never overwritten."""
    aside, n = segment.with_name(f"{segment.name}.{position}.tr"), 0
    while aside.exists():
        n += 1
        aside = segment.with_name(f"{segment.name}.{position}.{n}.tr")
    return aside


def set_aside(seg: Segment, why: str) -> None:
    """Moves a whole segment to ``<segment>.0.tr`` by renaming it: no copy, so it works on a full
    disk, which is the likeliest reason a write failed. Its modification time becomes now, when it was
    set aside, which ``prune_aside`` goes by (an inode update: no room needed either). That is only an
    order for pruning: if it cannot be set (a file another user owns, in a directory kcoord may rename
    in), the move stands and the later segments still follow, rather than a retry finding them left."""
    aside = aside_path(seg.path, 0)
    os.rename(seg.path, aside)
    with contextlib.suppress(OSError):
        os.utime(aside)
    fsync_path(seg.path.parent)
    log.warning("%s: set aside all %d bytes (%s), kept in %s", seg.path, seg.size, why, aside.name)


def cut_aside(seg: Segment, position: int, why: str) -> None:
    """Moves ``seg``'s bytes from ``position`` on into ``<segment>.<position>.tr``, then truncates."""
    with open(seg.path, "rb") as src:
        src.seek(position)
        data = src.read()
    aside = aside_path(seg.path, position)
    write_aside(aside, data)
    with open(seg.path, "r+b") as f:
        f.truncate(position)
        f.flush()
        os.fsync(f.fileno())
    fsync_path(seg.path.parent)
    seg.size = position
    log.warning("%s: cut %d bytes at byte %d (%s), kept in %s", seg.path, len(data), position, why, aside.name)


def aside_files(directory: Path) -> list[tuple[Path, int]]:
    """The segment bytes recoveries set aside in ``directory`` (``<segment>.<position>[.<n>].tr``; not a
    failed partition's ``journal-batches.<n>.tr``, kept for its repair) with their sizes, oldest first:
    by the time each was written or set aside, then by name."""
    found = []
    for entry in directory.iterdir():
        if _ASIDE_RE.match(entry.name):
            try:
                st = entry.stat()
            except FileNotFoundError:
                continue
            found.append((st.st_mtime_ns, entry.name, entry, st.st_size))
    found.sort()
    return [(path, size) for _, _, path, size in found]


def prune_aside(directory: Path, earlier: set[str], keep: int = ASIDE_KEPT) -> None:
    """Removes the oldest segment bytes set aside in ``directory`` while more than ``keep`` are there,
    but only ones named in ``earlier`` (present before the recovery now ending: what it set aside itself
    stays, however much), with a WARNING naming them. Kafka keeps no such copies; kcoord keeps the
    newest for an operator, and without a bound a crash loop or a flapping disk piled them up."""
    files = aside_files(directory)
    removed: list[tuple[str, int]] = []
    failed: OSError | None = None
    for path, size in files:
        if len(files) - len(removed) <= keep:
            break
        if path.name in earlier:
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:  # the rest stay for a later recovery; those removed are still named below
                failed = exc
                break
            removed.append((path.name, size))
    if removed:
        names = ", ".join(name for name, _ in removed[:20])
        if len(removed) > 20:
            names += f" and {len(removed) - 20} more"
        log.warning("%s: removed the %d oldest files of bytes set aside (%d bytes; the newest %d are kept): %s",
                    directory, len(removed), sum(size for _, size in removed), keep, names)
        fsync_path(directory)
    if failed is not None:
        raise failed


def whole_batches(data: bytes) -> Iterator[tuple[int, int, int]]:
    """``(position, base offset, size)`` of each whole batch in ``data`` (batches back to back, from its
    start), by their headers alone; it stops at the first length that makes no sense or runs past the end."""
    pos = 0
    while pos + BATCH_HEADER_BYTES <= len(data):
        base, size = read_head(data, pos)
        if size < BATCH_HEADER_BYTES or pos + size > len(data):
            return
        yield pos, base, size
        pos += size


def kept_journal_end(directory: Path) -> tuple[int, str]:
    """Where the batches of a failed partition's journal copies (``journal-batches.<n>.tr``, storage.journal
    ``abandon``) end, one past their last offset, or the synced end kept with them
    (``journal-synced-end.<n>.tr``), whichever is further, and the name of the copy that reaches furthest;
    (-1, "") without any. Acknowledged batches its journal no longer keeps: the log must hold them to load.
    Raises ValueError for a synced-end copy that holds neither an offset nor what a crash in its write
    leaves (damaged: ignored, it let the log load short of it)."""
    end, name = -1, ""
    for entry in sorted(directory.iterdir()):
        if _SYNCED_END_COPY_RE.match(entry.name):
            data = entry.read_bytes()
            if _SYNCED_END_TEXT.fullmatch(data) is None:
                if data.strip(b"\0").isdigit() or not data.strip(b"\0"):
                    # Digits without their newline, or nothing: a write a crash cut short (the journal
                    # still held the end then, and the next failure writes it again).
                    log.warning("%s holds no whole offset (%r): ignored", entry, data[:24])
                    continue
                raise ValueError(f"{entry} holds {data[:24]!r}, not an offset: damaged (repair the log, or remove "
                                 f"the file to accept the loss of what it held)")
            synced = int(data)
            if synced > end:
                end, name = synced, entry.name
            continue
        if not _JOURNAL_COPY_RE.match(entry.name):
            continue
        # Its last batch's end, not the highest: the journal's batches in their order, where a batch at
        # offsets already written replaces them from there on (the log cut back after a failed write:
        # what it replaces was never acknowledged, storage.journalentries ``resolve``).
        data = entry.read_bytes()
        copy_end = -1
        for pos, base, _ in whole_batches(data):
            copy_end = base + int32_at(data, pos + LAST_DELTA_POSITION) + 1
        if copy_end > end:
            end, name = copy_end, entry.name
    return end, name


def common_prefix(a: bytes, b: bytes) -> int:
    """Length of the longest common prefix of ``a`` and ``b`` (compared in halves: C-speed slices)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo
