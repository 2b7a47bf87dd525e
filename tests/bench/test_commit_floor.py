"""The group-commit floor probe really writes and syncs every commit that came due, over the bench
groups' own offsets partitions."""

from pathlib import Path

import pytest

from bench.commit_floor import RECORD_BYTES, group_commit_floor, group_logs
from protocol.partitioning import partition_for


def test_group_logs_are_the_bench_groups_offsets_partitions() -> None:
    logs = group_logs(64)
    assert len(logs) == 64
    assert logs[5] == partition_for("bench-group-5", 50)
    assert len(set(logs)) == 44  # as the harness's README says: 64 groups land on 44 of 50 partitions


def test_every_due_commit_is_written_synced_and_timed(tmp_path: Path) -> None:
    probe = group_commit_floor(tmp_path, rate=2000, groups=8, seconds=0.5)
    assert probe.commits == 1000
    assert probe.bytes_written == 1000 * RECORD_BYTES
    assert probe.logs == len(set(group_logs(8)))
    assert 1 <= probe.logs_per_sync <= probe.logs
    assert 0 < probe.p50_ms <= probe.p99_ms <= probe.p999_ms
    assert not (tmp_path / "commit-floor").exists()  # its scratch files are removed


def test_the_journal_layout_writes_every_commit_into_one_file(tmp_path: Path) -> None:
    probe = group_commit_floor(tmp_path, rate=2000, groups=8, seconds=0.5, journal=True)
    assert probe.how == "one journal file, fdatasync"
    assert probe.commits == 1000
    assert probe.bytes_written == 1000 * RECORD_BYTES
    assert probe.logs == 1 and probe.logs_per_sync == 1
    assert 0 < probe.p50_ms <= probe.p99_ms <= probe.p999_ms
    assert not (tmp_path / "commit-floor").exists()


def test_refuses_a_rate_of_nothing(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        group_commit_floor(tmp_path, rate=0, groups=8)
