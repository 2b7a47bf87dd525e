"""Every import of kcoord's own code the harness makes, in one place.

The core is being rewritten while the harness is used, so its internal APIs may change; when they do,
this module is the only one to adapt. The harness needs kcoord's code for three things only: to start
it (``tests.kcoord_process``), to write a log file byte for byte as kcoord writes it (the restart
scenario), and to read batch headers back (commits per fsync) and the log line that reports a load.
Everything else in ``bench/`` talks to kcoord over the wire like any other server.
"""

import compileall
import re
from collections.abc import Iterable
from pathlib import Path

from protocol.compiled import PACKAGES
from protocol.partitioning import partition_for
from protocol.records import OffsetAndMetadata, OffsetCommitRecord, OffsetKey, encode_record
from storage.batch import RECORDS_COUNT_POSITION
from storage.batchwriter import build_batch
from storage.log import PartitionLog
from storage.segments import whole_batches
from tests.kcoord_process import REPO, KcoordProcess, free_port, wait_port
from tests.tansu_process import tansu_binary as tansu_in_venv

__all__ = [
    "OFFSETS_TOPIC", "KcoordProcess", "byte_compile", "free_port", "loaded_line", "log_totals", "offsets_partition",
    "tansu_in_venv", "wait_port", "write_offsets_partition",
]

OFFSETS_TOPIC = "__consumer_offsets"
COMMIT_TIMESTAMP = 1_700_000_000_000


def offsets_partition(group: str, partitions: int) -> int:
    """The ``__consumer_offsets`` partition (and kcoord shard) of ``group``: Kafka's hash."""
    return partition_for(group, partitions)


def write_offsets_partition(directory: Path, commits: Iterable[tuple[str, str, int, int]], batch_records: int) -> int:
    """Writes ``(group, topic, partition, offset)`` commits as kcoord's writer does: v2 batches of
    ``batch_records`` OffsetCommit records appended to a PartitionLog, then one sync. Returns bytes."""
    plog = PartitionLog(directory)
    try:
        entries: list[tuple[bytes, bytes | None]] = []  # (key, value) of each record
        base = 0
        for group, topic, partition, offset in commits:
            entries.append(encode_record(OffsetCommitRecord(OffsetKey(group, topic, partition),
                                                            OffsetAndMetadata(offset, -1, "", COMMIT_TIMESTAMP))))
            if len(entries) == batch_records:
                plog.append(build_batch(base, entries, COMMIT_TIMESTAMP), base + len(entries) - 1)
                base += len(entries)
                entries = []
        if entries:
            plog.append(build_batch(base, entries, COMMIT_TIMESTAMP), base + len(entries) - 1)
        plog.sync()
        return plog.size_bytes
    finally:
        plog.close()


def log_totals(data_dir: Path) -> tuple[int, int]:
    """(batches, records) in every complete batch of kcoord's offsets logs, from the batch headers
    alone. kcoord fsyncs once per shard flush and a flush writes one batch unless it exceeds ~1 MiB,
    so the records/batch of a run is the number of commits that shared an fsync."""
    batches = records = 0
    for seg in data_dir.glob(f"{OFFSETS_TOPIC}-*/*.log"):
        data = seg.read_bytes()
        for pos, _, _ in whole_batches(data):
            records += int.from_bytes(data[pos + RECORDS_COUNT_POSITION : pos + RECORDS_COUNT_POSITION + 4], "big")
            batches += 1
    return batches, records


def loaded_line(log: str, partition: int) -> tuple[str, int, float] | None:
    """kcoord's ``partition P: loaded N records ... in X ms`` line: (line, records, milliseconds)."""
    found = None
    for match in re.finditer(rf"^.*partition {partition}: loaded (\d+) records.* in (\d+) ms.*$", log, re.MULTILINE):
        found = (match.group(0), int(match.group(1)), float(match.group(2)))
    return found


def byte_compile() -> None:
    """Writes the bytecode of kcoord's own modules, as ``pip install`` does for an installed kcoord: a
    source tree run with PYTHONDONTWRITEBYTECODE=1 (this machine sets it) otherwise compiles all of
    them at every start, ~60-80 ms of a restart that a deployed kcoord does not spend."""
    for package in PACKAGES:
        compileall.compile_dir(REPO / package, quiet=1)
