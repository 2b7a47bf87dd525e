"""The jobs over logs kcoord's own cleaner compacted (storage.cleaner, as the service runs it)."""

from pathlib import Path
from typing import Any

import storage.cleaner
from pipeline.reader import read_offsets_log
from storage.log import PartitionLog
from tests.pipeline.logs import T, commit, plain_batches, write_partition
from tests.pipeline.test_jobs import job


def test_records_compaction_removed_from_segments_it_left_empty_are_counted(spark: Any, tmp_path: Path) -> None:
    """The cleaner leaves a segment whose records are all superseded as an empty file at its base
    offset. The jobs skip empty files, and the count of removed records started at the first segment
    with bytes: a partition whose compaction had only emptied its first segments counted none, so
    history said nothing of compaction (a pipeline campaign's find: a real kcoord's log, 11,223 of 11,315 counted)."""
    directory = tmp_path / "data" / "__consumer_offsets-0"
    write_partition(directory, plain_batches([[commit("g", "t", 0, i, ts=T + i)] for i in range(200)]),
                    segment_bytes=2048)
    plog = PartitionLog(directory, 2048)
    for _ in plog.recover():
        pass
    storage.cleaner.clean(plog, T + 1000, 86_400_000)
    plog.close()
    sizes = {int(p.name[:20]): p.stat().st_size for p in directory.glob("*.log")}
    assert sizes[0] == 0  # every record of the cleaned segments was superseded
    first_kept = min(base for base, size in sizes.items() if size)
    assert first_kept > 0

    read = read_offsets_log(spark, [str(tmp_path / "data")])
    assert read.df.count() == 200 - first_kept  # the records after it: none removed there
    assert read.removed_by_compaction == first_kept
    code, err = job(spark, "history", "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "history"))
    assert code == 0 and f"the log was compacted ({first_kept:,} records removed)" in err, err
