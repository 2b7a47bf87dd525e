"""The floor of a serial group commit on kcoord's disk, at the paced scenario's rate.

The issue's latency target compares kcoord's p99 at half its peak with one fsync's p99. A group
commit cannot get near that: a commit that comes due while a sync is under way waits for the rest of
it and then for its own. This probe measures what the best serial group commit achieves here, so the
paced p99 can be read against a ceiling measured in the same run.

One thread does only the group commit: it appends one record to its partition's log for every commit
that has come due (paced like ``commit-1-half``, over the same groups' offsets partitions), makes them
durable together the way kcoord does (one ``syncfs`` of the file system; ``fdatasync`` per log where
``syncfs`` is missing), and goes again at once. It spins between syncs rather than sleeping. No
sockets, codecs, event loop or replies. Latency is counted from when each commit was due, as the
pacer counts it.

``journal=True`` measures the layout of kcoord's ``--sync-mode journal`` (its default since
2026-11-27): every commit appended to one file, one ``fdatasync`` of it per sync (the write-ahead
journal in front of the partitions' logs, storage/journal.py), without the logs' own appends and
checkpoints. The other is ``--sync-mode syncfs``'s layout.
"""

import os
import time
from dataclasses import dataclass
from pathlib import Path

from protocol.partitioning import partition_for
from storage.sync import SYNCFS

OFFSETS_PARTITIONS = 50  # kcoord's default, as the harness runs it
RECORD_BYTES = 128  # about one 1-partition commit's record batch as kcoord writes it


@dataclass
class FloorProbe:
    """The serial group commit's figures: latency from each commit's due time to its sync's return."""

    path: str
    how: str  # "syncfs", "fdatasync per log" or "one journal file, fdatasync"
    rate: float
    logs: int  # distinct partition logs the commits went to
    commits: int
    seconds: float
    syncs_per_s: float
    logs_per_sync: float
    p50_ms: float
    p99_ms: float
    p999_ms: float
    bytes_written: int  # the logs' sizes at the end: every commit's record really went to disk


def group_logs(groups: int, partitions: int = OFFSETS_PARTITIONS) -> list[int]:
    """The offsets partition of each bench group, in the order the uniform scenarios cycle through them."""
    return [partition_for(f"bench-group-{g}", partitions) for g in range(groups)]


def group_commit_floor(directory: Path, rate: float, groups: int, seconds: float = 3.0,
                       journal: bool = False) -> FloorProbe:
    """Runs the serial group commit at ``rate`` commits/s for ``seconds`` in a scratch directory under
    ``directory`` (removed afterwards); with ``journal``, into one file instead of the groups' logs."""
    if rate <= 0 or groups <= 0:
        raise ValueError("rate and groups must be positive")
    scratch = directory / "commit-floor"
    scratch.mkdir(parents=True, exist_ok=True)
    order = [0] * groups if journal else group_logs(groups)
    logs = sorted(set(order))
    fds = {p: os.open(scratch / f"p{p}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o600)
           for p in logs}
    dir_fd = os.open(scratch, os.O_RDONLY)
    record = b"r" * RECORD_BYTES
    gap = 1.0 / rate
    latencies: list[float] = []
    syncs = synced_logs = 0
    try:
        start = time.perf_counter() + 0.01
        total = int(seconds * rate)
        done = 0
        while done < total:
            now = time.perf_counter()
            due = min(total, int((now - start) / gap) + 1) if now >= start else 0
            if due <= done:
                continue
            touched = set()
            for i in range(done, due):
                p = order[i % len(order)]
                os.write(fds[p], record)
                touched.add(p)
            if journal:
                os.fdatasync(fds[0])
            elif SYNCFS is not None:
                SYNCFS(dir_fd)
            else:
                for p in touched:
                    os.fdatasync(fds[p])
            end = time.perf_counter()
            syncs += 1
            synced_logs += len(touched)
            latencies.extend(end - (start + i * gap) for i in range(done, due))
            done = due
        elapsed = time.perf_counter() - start
        written = sum(os.fstat(fd).st_size for fd in fds.values())
    finally:
        for fd in fds.values():
            os.close(fd)
        os.close(dir_fd)
        for p in logs:
            (scratch / f"p{p}.log").unlink(missing_ok=True)
        scratch.rmdir()
    latencies.sort()

    def q(frac: float) -> float:
        return latencies[min(len(latencies) - 1, int(frac * len(latencies)))] * 1000

    how = "one journal file, fdatasync" if journal else "syncfs" if SYNCFS is not None else "fdatasync per log"
    return FloorProbe(str(directory), how, rate, len(logs),
                      len(latencies), elapsed, syncs / elapsed, synced_logs / max(1, syncs), q(0.5), q(0.99),
                      q(0.999), written)
