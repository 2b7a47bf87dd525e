"""bench.sync_cost measures each way of syncing for each number of logs asked for."""

from pathlib import Path

import pytest

from bench.sync_cost import measure
from storage.sync import SYNCFS


@pytest.mark.skipif(SYNCFS is None, reason="no syncfs here")
def test_one_line_per_way_and_count(tmp_path: Path) -> None:
    lines = measure(tmp_path, [1, 3], rounds=5)
    assert [line.split("  ")[0] for line in lines[:4]] == [
        "one syncfs", "fdatasync per log, in turn", "fdatasync per log, k threads", "two syncfs overlapping (both)"]
    assert sum(" 3 logs: p50 " in line for line in lines) == 4 and len(lines) == 8
    assert (tmp_path / "log0").stat().st_size == 2 * 4 * 5 * 200  # really appended: 2 counts x 4 ways x 5 rounds
