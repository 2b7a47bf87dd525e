"""bench.sync_cost measures each way of syncing for each number of logs asked for."""

from pathlib import Path

import pytest

from bench.sync_cost import measure
from storage.sync import SYNCFS


@pytest.mark.skipif(SYNCFS is None, reason="no syncfs here")
def test_one_line_per_way_and_count(tmp_path: Path) -> None:
    lines = measure(tmp_path, [1, 3], rounds=5)
    assert [line.split("  ")[0] for line in lines[:6]] == [
        "one syncfs", "fdatasync per log, in turn", "fdatasync per log, k threads", "two syncfs overlapping (both)",
        "preallocated, one syncfs", "preallocated, fdatasync k threads"]
    assert sum(" 3 logs: p50 " in line for line in lines) == 6 and len(lines) == 12
    assert (tmp_path / "log0").stat().st_size == 2 * 4 * 5 * 200  # really appended: 2 counts x 4 ways x 5 rounds
    # the preallocated logs: written over in place (2 counts x 2 ways x 5 rounds), never grown
    assert (tmp_path / "pre0").read_bytes() == b"x" * (2 * 2 * 5 * 200)
