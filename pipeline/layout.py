"""Where an offsets log lives and how its bytes are read.

A log is found from one or more directories: a kcoord data directory, a Kafka broker log directory (both
hold ``__consumer_offsets-<p>/`` directories; other topics, ``-delete`` and ``-future`` directories are
ignored) or one ``__consumer_offsets-<p>`` directory. Segments are ``<20-digit base offset>.log`` files
(reference section 8.4). Paths without a scheme are local files; any other URI is opened with pyarrow's
file systems (``file://``, ``hdfs://`` through libhdfs, ``s3://``; Hadoop's ``s3a://`` is read as
``s3://``), on the driver to list and on the executors to read byte ranges, which is what lets one
segment be decoded by several tasks.
"""

import functools
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol
from urllib.parse import unquote

from storage.log import RECOVERY_POINT

OFFSETS_TOPIC = "__consumer_offsets"  # as coordinator.runtime (a test checks they agree)
META_FILE = "kcoord.meta.json"  # records offsets_partitions in a kcoord data directory
_PARTITION_DIR = re.compile(rf"^{OFFSETS_TOPIC}-(\d+)$")
_SEGMENT = re.compile(r"^(\d{20})\.log$")
_KCOORD_SWAP = re.compile(r"^(\d{20})-(\d{20})\.swap$")  # as storage.segments (a test checks they agree)


class LayoutError(Exception):
    """The directories given do not hold a readable offsets log."""


class Entry(NamedTuple):
    name: str
    is_dir: bool
    size: int


class Files(Protocol):
    """The few file operations the pipeline needs, for one file system."""

    def listdir(self, path: str) -> list[Entry]: ...

    def is_dir(self, path: str) -> bool: ...

    def read(self, path: str, start: int, length: int) -> bytes: ...

    def join(self, directory: str, name: str) -> str: ...


class LocalFiles:
    def listdir(self, path: str) -> list[Entry]:
        with os.scandir(path) as it:
            return [Entry(e.name, e.is_dir(), 0 if e.is_dir() else e.stat().st_size) for e in it]

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(path)

    def read(self, path: str, start: int, length: int) -> bytes:
        with open(path, "rb") as f:
            f.seek(start)
            return f.read(length)

    def join(self, directory: str, name: str) -> str:
        return os.path.join(directory, name)


class ArrowFiles:
    """A pyarrow file system; paths keep their URI so an executor can open the same file."""

    def __init__(self, uri: str) -> None:
        from pyarrow import fs

        self._fs, _ = fs.FileSystem.from_uri(_arrow_uri(uri))
        self._fs_module = fs

    def _path(self, uri: str) -> str:
        _, path = self._fs_module.FileSystem.from_uri(_arrow_uri(uri))
        return str(path)

    def listdir(self, path: str) -> list[Entry]:
        selector = self._fs_module.FileSelector(self._path(path))
        infos = self._fs.get_file_info(selector)
        return [Entry(i.base_name, i.type == self._fs_module.FileType.Directory, int(i.size or 0)) for i in infos]

    def is_dir(self, path: str) -> bool:
        return bool(self._fs.get_file_info(self._path(path)).type == self._fs_module.FileType.Directory)

    def read(self, path: str, start: int, length: int) -> bytes:
        with self._fs.open_input_file(self._path(path)) as f:
            return bytes(f.read_at(length, start))

    def join(self, directory: str, name: str) -> str:
        return directory.rstrip("/") + "/" + name


def _arrow_uri(uri: str) -> str:
    for hadoop_scheme in ("s3a://", "s3n://"):
        if uri.startswith(hadoop_scheme):
            return "s3://" + uri[len(hadoop_scheme):]
    return uri


def is_uri(path: str) -> bool:
    return re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", path) is not None


def location(given: str) -> str:
    """A ``--data-dir`` or ``--out`` as the jobs read it. A local file URI in any of RFC 8089's forms
    (``file:/p``, ``file://localhost/p``, any case of the scheme or of ``localhost``) becomes
    ``file:///p``, the one form the local checks, pyarrow and Hadoop all take as local; another
    host's keeps its host, with the scheme in lower case; anything else as given. A file URI with a
    query or a fragment is refused (LayoutError): pyarrow drops them and reads the directory before
    them, while the check for a running kcoord and Hadoop take them as part of the name. pyarrow's own
    alias for the local file system, ``local:``, is read as ``file:`` (it skipped that check: a review's
    find; Hadoop does not know it)."""
    if given[:6].lower() == "local:":
        given = "file:" + given[6:]
    if given[:5].lower() != "file:":
        return given
    rest = given[5:]
    if "?" in rest or "#" in rest:
        raise LayoutError(f"{given}: a file URI cannot have a query or a fragment ('?', '#'); write a '?' or '#' "
                          "in a name as %3F or %23, or give the path itself")
    if rest.startswith("//"):
        host, _, path = rest[2:].partition("/")
        if host.lower() in ("", "localhost"):
            return "file:///" + path
        return f"file://{host}/{path}"
    if rest.startswith("/"):
        return "file://" + rest
    return given


def local_path(given: str, *, decoded: bool = False) -> Path | None:
    """The local path a plain path or a ``file:///`` URI names; None for any other URI (``file://host/...``
    included). ``decoded``: the URI's percent-escapes decoded, as pyarrow reads a ``--data-dir``
    (``file:///a%20b`` is ``/a b`` there; Hadoop, which writes a Spark job's ``--out``, keeps ``%20``)."""
    local = given.removeprefix("file://")
    if is_uri(local) or (local != given and not local.startswith("/")):
        return None
    return Path(unquote(local) if decoded and local != given else local)


@functools.lru_cache(maxsize=64)
def files_for(path: str) -> Files:
    """The file system of ``path`` (one per scheme and authority, cached per process)."""
    if not is_uri(path):
        return LocalFiles()
    scheme, rest = path.split("://", 1)
    return _arrow_files(f"{scheme}://{rest.split('/', 1)[0]}/")


@functools.lru_cache(maxsize=64)
def _arrow_files(root: str) -> Files:
    return ArrowFiles(root)


@dataclass(frozen=True, slots=True)
class SegmentFile:
    """One segment and what decides how its damage is judged: damage at or past ``durable_below``
    (kcoord's recovery point; 0 without one, as in Kafka's directories) is cut aside by kcoord's recovery
    with everything after it, a torn write that was never acknowledged; damage below it is corruption."""

    path: str
    log_partition: int
    base_offset: int
    size: int
    last: bool
    durable_below: int


def find_segments(paths: Iterable[str]) -> list[SegmentFile]:
    """Every segment under ``paths``, by log partition then base offset."""
    partitions: dict[int, str] = {}
    for path in paths:
        for number, directory in _partition_dirs(path):
            if number in partitions:
                raise LayoutError(f"partition {number} is in both {partitions[number]} and {directory}")
            partitions[number] = directory
    if not partitions:
        raise LayoutError(f"no {OFFSETS_TOPIC}-N directories in {', '.join(paths)}")
    out: list[SegmentFile] = []
    for number in sorted(partitions):
        out.extend(_segments_of(number, partitions[number]))
    return out


def _partition_dirs(path: str) -> list[tuple[int, str]]:
    files = files_for(path)
    own = _PARTITION_DIR.match(_basename(path))
    if own:
        return [(int(own.group(1)), path)]
    entries = _listed(files, path)
    found = []
    for entry in entries:
        m = _PARTITION_DIR.match(entry.name)
        if m and entry.is_dir:
            found.append((int(m.group(1)), files.join(path, entry.name)))
    return found


def _listed(files: Files, path: str) -> list[Entry]:
    """``path``'s entries, or a LayoutError naming it (unreadable, or an entry that cannot be stat'ed,
    such as a dangling symlink named like a segment)."""
    try:
        return files.listdir(path)
    except (OSError, ValueError) as exc:
        raise LayoutError(f"cannot list {path}: {exc}") from exc


def data_dir_of(path: Path) -> Path:
    """The data directory a ``--data-dir`` names: itself, or the parent of a single partition's
    directory (where its lock and journal are)."""
    return path.parent if _PARTITION_DIR.match(path.name) else path


def _basename(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _segments_of(number: int, directory: str) -> list[SegmentFile]:
    files = files_for(directory)
    entries = _listed(files, directory)
    segments = sorted((int(m.group(1)), e) for e in entries if (m := _SEGMENT.match(e.name)) and not e.is_dir)
    segments = _after_swaps(directory, entries, segments)
    known_base, known_position = _recovery_point(files, directory, {e.name for e in entries})
    out = []
    for i, (base, entry) in enumerate(segments):
        if base < known_base:
            durable = entry.size
        elif base == known_base:
            durable = known_position
        else:
            durable = 0
        out.append(SegmentFile(files.join(directory, entry.name), number, base, entry.size, i == len(segments) - 1,
                               durable))
    return out


def _after_swaps(directory: str, entries: list[Entry], segments: list[tuple[int, Entry]]) -> list[tuple[int, Entry]]:
    """The segments as kcoord's next start sees them. A crash during a compaction swap leaves a durable
    ``<base>-<end>.swap`` that replaces the segments with base offsets in ``[base, end)``, some of them
    possibly deleted already; kcoord completes the swap when it opens the log
    (storage.segments.finish_interrupted_swaps), so the swap is read in their place, or records only
    it still holds would be missed. Kafka's own ``.log.swap`` files (no range in their name) are refused."""
    for entry in sorted(entries):
        if entry.is_dir or not entry.name.endswith(".swap"):
            continue
        m = _KCOORD_SWAP.match(entry.name)
        if m is None:
            raise LayoutError(f"{directory}: {entry.name} is an interrupted compaction swap; start the broker on "
                              "this directory once (it completes the swap) before reading it")
        base, end = int(m.group(1)), int(m.group(2))
        segments = sorted([(b, e) for b, e in segments if not base <= b < end] + [(base, entry)])
    return segments


def _recovery_point(files: Files, directory: str, names: set[str]) -> tuple[int, int]:
    """kcoord's ``recovery-point`` (``<segment base> <byte position>``), or (-1, 0) if absent or unreadable."""
    if RECOVERY_POINT not in names:
        return -1, 0
    try:
        base, position = files.read(files.join(directory, RECOVERY_POINT), 0, 256).decode().split()
        return int(base), int(position)
    except (OSError, ValueError):
        return -1, 0


def describe(segments: list[SegmentFile]) -> dict[str, Any]:
    """Counts for progress lines and reports."""
    return {
        "partitions": len({s.log_partition for s in segments}),
        "segments": len(segments),
        "bytes": sum(s.size for s in segments),
    }
