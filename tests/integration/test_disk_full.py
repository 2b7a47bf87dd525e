"""A full disk, for real: kcoord's data directory on a small tmpfs. Acknowledged offsets stay readable
while the disk is full, commits get a retriable error, and commits resume without a restart once space
is freed; nothing acknowledged is lost across a restart. Needs root to mount; skipped otherwise."""

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from protocol.errors import ErrorCode
from tests.conftest import Report
from tests.kcoord_process import KcoordProcess
from tests.rawclient import RawClient, commit_request, fetch_request

RETRIABLE = {ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.COORDINATOR_NOT_AVAILABLE}
GROUP, TOPIC, PARTITIONS = "disk-full", "t", 64
METADATA = "m" * 2000  # big records fill the disk quickly


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], capture_output=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({result.stderr.decode().strip()}): ENOSPC is covered by the "
                    "injected short write + ENOSPC in tests/coordinator/test_shard.py")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


# Small segments to compact, and a cleaner backoff of an hour: what compacts within the tests is woken.
COMPACTING = ("--segment-bytes", "65536", "--log-cleaner-backoff-ms", "3600000")


def started_on(mount: Path, *extra: str) -> KcoordProcess:
    """kcoord with its data directory on ``mount`` (``data``) and its own log beside it, not on it."""
    server = KcoordProcess(mount / "data", "--offsets-partitions", "4", *extra)
    server.log_path = mount.parent / "kcoord.log"  # the log must not land on the full disk
    server.start()
    return server


def fill(mount: Path, leave: int) -> Path:
    """A file taking all of ``mount``'s free space but ``leave`` bytes; delete it to free them."""
    filler = mount / "filler"
    free = os.statvfs(mount).f_bavail * os.statvfs(mount).f_frsize
    with open(filler, "wb") as f:
        f.write(b"\0" * max(free - leave, 0))
    return filler


def commit_all(client: RawClient, value: int) -> dict[int, int]:
    """Commits ``value`` to every partition; returns the error code of each."""
    resp = client.call(commit_request(GROUP, {(TOPIC, p): value for p in range(PARTITIONS)}, METADATA), 8)
    return {p.partition_index: p.error_code for p in resp.topics[0].partitions}


def fetch_all(client: RawClient, deadline: float) -> dict[int, int]:
    """Committed offsets of every partition, retrying errors a client retries."""
    while True:
        resp = client.call(fetch_request(GROUP, {TOPIC: list(range(PARTITIONS))}), 7)
        if resp.error_code == 0:
            return {p.partition_index: p.committed_offset for p in resp.topics[0].partitions}
        assert resp.error_code in RETRIABLE, resp
        assert time.monotonic() < deadline, "fetches never recovered"
        time.sleep(0.05)


def test_full_disk_keeps_offsets_readable_and_commits_resume_when_space_returns(small_disk: Path,
                                                                               report: Report) -> None:
    server = started_on(small_disk)
    client = RawClient(server.port, timeout=30)
    try:
        filler = fill(small_disk, 1_500_000)
        acked = value = 0
        while True:
            value += 1
            errors = commit_all(client, value)
            if set(errors.values()) == {0}:
                acked = value
                continue
            assert set(errors.values()) <= RETRIABLE | {0}, errors
            break
        assert acked > 0
        # Full: what was acknowledged is still served; commits get retriable errors.
        deadline = time.monotonic() + 30
        assert set(fetch_all(client, deadline).values()) == {acked}
        assert set(commit_all(client, value + 1).values()) <= RETRIABLE
        assert set(fetch_all(client, deadline).values()) == {acked}
        # Space comes back: commits resume without a restart.
        filler.unlink()
        freed = time.monotonic()
        while set(commit_all(client, value + 2).values()) != {0}:
            assert time.monotonic() - freed < 60, "commits never resumed"
            time.sleep(0.05)
        report.figure("commits resuming after space was freed", (time.monotonic() - freed) * 1000, "ms")
        assert set(fetch_all(client, time.monotonic() + 30).values()) == {value + 2}
        client.close()
        assert server.stop() == 0
        server.start()
        reader = RawClient(server.port)
        assert set(fetch_all(reader, time.monotonic() + 30).values()) == {value + 2}
        reader.close()
        log = server.log()
        assert "cannot be written" in log and "writable again" in log, log
        assert "Traceback" not in log
    finally:
        server.kill() if server.proc is not None and server.proc.poll() is None else None


def test_a_restart_on_a_full_disk_with_torn_tails_serves_reads_then_recovers(small_disk: Path, report: Report) -> None:
    """Fault campaign D4: restarted with no space and torn tails to set aside, partitions stayed FAILED
    and empty .tr files piled up. Now: reads are served, and writes resume once space is freed."""
    data = small_disk / "data"
    server = started_on(small_disk)
    client = RawClient(server.port, timeout=30)
    assert set(commit_all(client, 7).values()) == {0}
    client.close()
    assert server.stop() == 0
    for seg in data.glob("__consumer_offsets-*/*.log"):
        if seg.stat().st_size:
            with open(seg, "ab") as f:
                f.write(b"\xfe" * 300)  # a torn tail past the recovery point
    filler = small_disk / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    server.start()
    client = RawClient(server.port, timeout=30)
    assert set(fetch_all(client, time.monotonic() + 30).values()) == {7}
    assert set(commit_all(client, 8).values()) <= RETRIABLE
    assert not list(data.glob("__consumer_offsets-*/*.tr"))  # no empty copies from failed attempts
    filler.unlink()
    freed = time.monotonic()
    while set(commit_all(client, 9).values()) != {0}:
        assert time.monotonic() - freed < 60, "commits never resumed"
        time.sleep(0.05)
    report.figure("commits resuming after a full-disk restart once space was freed", (time.monotonic() - freed) * 1000,
                  "ms")
    assert set(fetch_all(client, time.monotonic() + 30).values()) == {9}
    assert list(data.glob("__consumer_offsets-*/*.tr"))  # the torn tails were kept aside after all
    client.close()
    assert server.stop() == 0


def log_bytes(data: Path) -> int:
    """The partition logs' size, read while the cleaner may be swapping segments (one listed can be gone)."""
    total = 0
    for segment in data.glob("__consumer_offsets-*/*.log"):
        try:
            total += segment.stat().st_size
        except FileNotFoundError:
            pass
    return total


def test_room_freed_on_a_full_disk_is_compacted_before_writers_fill_it_again(small_disk: Path, report: Report) -> None:
    """Fault campaign: on a disk kcoord's own log filled, writers took the freed room again within
    seconds, long before the cleaner's next look (every 15 s), so compaction never gave any back. A
    partition finding its disk writable again now wakes the cleaner (here its backoff is an hour).
    The cleaner is also woken when a write fails (next test), and may compact while the disk is still
    full if a cleaned segment fits; either way the freed room must not stay filled with superseded
    offsets. (The wake itself: tests/coordinator/test_shard.py, deterministically.)"""
    data = small_disk / "data"
    server = started_on(small_disk, *COMPACTING)
    client = RawClient(server.port, timeout=30)
    try:
        filler = fill(small_disk, 3_000_000)
        value = peak = 0
        while True:  # the same keys again and again: nearly all of the log is dirty
            value += 1
            errors = commit_all(client, value)
            if set(errors.values()) != {0}:
                assert set(errors.values()) <= RETRIABLE | {0}, errors
                break
            peak = max(peak, log_bytes(data))
        report.figure("partition logs at their largest before commits were refused", peak / 1000, "KB")
        filler.unlink()
        freed = time.monotonic()
        while set(commit_all(client, value + 1).values()) != {0}:  # the writers come back
            assert time.monotonic() - freed < 60, "commits never resumed"
            time.sleep(0.05)
        while "compacted" not in server.log() or log_bytes(data) >= peak / 2:
            assert time.monotonic() - freed < 60, ("no compaction after space was freed", peak, log_bytes(data))
            time.sleep(0.1)
        report.figure("compaction after space was freed", (time.monotonic() - freed) * 1000, "ms")
        assert set(fetch_all(client, time.monotonic() + 30).values()) == {value + 1}
        client.close()
        assert server.stop() == 0
    finally:
        server.kill() if server.proc is not None and server.proc.poll() is None else None


def test_a_disk_its_own_log_filled_is_compacted_back_to_room_without_an_operator(small_disk: Path,
                                                                                  report: Report) -> None:
    """Fault campaign: once kcoord's own log had filled the disk and every partition was read-only,
    nothing compacted (only serving partitions were), so the disk stayed full until an operator freed
    space, though nearly all of it was superseded offsets. A partition read-only for want of room is
    compacted now, and the cleaner looks as soon as a write fails (here its backoff is an hour). Not
    while the journal keeps segments for a partition whose run cannot be written back (README, Full
    disk), which one client's commits to one group do not bring about here."""
    server = started_on(small_disk, *COMPACTING)
    client = RawClient(server.port, timeout=30)
    try:
        fill(small_disk, 3_000_000)
        value = acked = 0
        refused_at: float | None = None
        while True:  # the same keys again and again, with nobody freeing anything
            value += 1
            errors = commit_all(client, value)
            if set(errors.values()) == {0}:
                acked = value
                if refused_at is not None:
                    break
                continue
            assert set(errors.values()) <= RETRIABLE | {0}, errors
            refused_at = refused_at or time.monotonic()
            assert time.monotonic() - refused_at < 60, "commits never resumed on the full disk"
            time.sleep(0.05)
        report.figure("commits resuming on a disk the log filled", (time.monotonic() - refused_at) * 1000, "ms")
        assert "compacted" in server.log()
        assert set(fetch_all(client, time.monotonic() + 30).values()) == {acked}
        client.close()
        assert server.stop() == 0
    finally:
        server.kill() if server.proc is not None and server.proc.poll() is None else None
