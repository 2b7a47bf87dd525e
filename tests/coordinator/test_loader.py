"""A record that does not parse inside a whole batch (its CRC holds: a writer's batch, not a torn write),
loaded both ways (compiled loadcodec and pure Python: tests/coordinator/conftest.py). Recovery judges the
batch first, as Kafka's log recovery does before its loader reads a record: one it keeps fails the
partition, wherever it lies (Kafka's CoordinatorLoaderImpl fails the load on a record it cannot
deserialize); one whose offsets go back past the recovery point is cut aside as damage, and one where the
journal's run starts is replaced by the run, its records never read. The compiled path read the records
before recovery's verdict and failed the partition in those two cases, where pure Python loaded it."""

from pathlib import Path

import pytest

from coordinator.loader import replay_log
from coordinator.state import ShardData
from protocol.records import RecordError
from storage.batchwriter import build_batch
from storage.log import RECOVERY_POINT, LogCorruptError, PartitionLog
from storage.segments import segment_name
from tests.coordinator.test_load_kafka_logs import T, kafka_batch, offset
from tests.storage.test_journal import P, acknowledged, opened

pytestmark = pytest.mark.usefixtures("both_loader_paths")


def unparseable(base: int, group: str = "g") -> bytes:
    """A batch of two records whose second, an offset commit, has its value cut to 5 bytes: every length
    in the batch adds up and its CRC holds, but no schema reads that value."""
    key, value = offset(group, 1, 100)
    assert value is not None
    return kafka_batch(base, [offset(group, 0, 100), (key, value[:5])])


def good(base: int, group: str = "g") -> bytes:
    return build_batch(base, [offset(group, 2, base)], T)


def written(directory: Path, claimed: int, after: list[bytes]) -> bytes:
    """A log of ``claimed`` good batches, its recovery point after them, then ``after`` past it."""
    plog = PartitionLog(directory)
    list(plog.recover())
    for i in range(claimed):
        plog.append(good(i), i)
    plog.sync()
    plog.checkpoint()
    for raw in after:
        plog.append(raw, int.from_bytes(raw[:8], "big") + int.from_bytes(raw[23:27], "big"))
    plog.sync(checkpoint=False)
    plog.close()
    return (directory / segment_name(0)).read_bytes()


def load(directory: Path) -> tuple[int, ShardData]:
    data = ShardData()
    return replay_log(0, PartitionLog(directory), data, False, lambda: False), data


def aside(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tr"))


@pytest.mark.parametrize("claimed", [3, 6], ids=["past the recovery point", "below it"])
def test_a_kept_batch_with_a_record_that_does_not_parse_fails_the_load(tmp_path: Path, claimed: int) -> None:
    before = written(tmp_path, 3, [unparseable(3), good(5)])
    if claimed == 6:  # the recovery point past the whole log
        (tmp_path / RECOVERY_POINT).write_text(f"0 {len(before)}\n")
    with pytest.raises(RecordError, match=r"batch at offsets \[3, 4\]: OffsetCommitValue"):
        load(tmp_path)
    assert (tmp_path / segment_name(0)).read_bytes() == before  # nothing cut: an operator repairs it
    assert aside(tmp_path) == []


def test_one_whose_offsets_go_back_past_the_recovery_point_is_cut_aside_as_damage(tmp_path: Path) -> None:
    before = written(tmp_path, 3, [unparseable(1), good(3)])
    records, data = load(tmp_path)
    assert records == 3 and data.committed("g", "t", 2) is not None
    end = len(b"".join(good(i) for i in range(3)))
    assert (tmp_path / segment_name(0)).read_bytes() == before[:end]
    assert aside(tmp_path) == [f"{segment_name(0)}.{end}.tr"]


def test_one_below_the_recovery_point_whose_offsets_go_back_is_corruption(tmp_path: Path) -> None:
    before = written(tmp_path, 3, [unparseable(1), good(3)])
    (tmp_path / RECOVERY_POINT).write_text(f"0 {len(before)}\n")
    with pytest.raises(LogCorruptError, match="below expected 3"):
        load(tmp_path)


def test_one_where_the_journals_run_starts_is_replaced_by_the_run(tmp_path: Path) -> None:
    """After a crash the journal holds batches 0-2; the log's batch 0 was overwritten meanwhile by
    another writer's: the run is written over it (kept aside), and the partition loads."""
    journal, plog = opened(tmp_path)
    acknowledged(journal, plog, [good(0), good(1), good(2)])
    plog.close()
    journal.close(remove=False)  # a crash: the journal keeps them
    directory = tmp_path / f"__consumer_offsets-{P}"
    segment = directory / segment_name(0)
    segment.write_bytes(unparseable(0) + segment.read_bytes()[len(good(0)):])
    journal, plog = opened(tmp_path, recover=False)
    data = ShardData()
    assert replay_log(P, plog, data, False, lambda: False) == 3
    assert data.committed("g", "t", 2) is not None and data.committed("g", "t", 0) is None
    assert segment.read_bytes() == good(0) + good(1) + good(2)
    assert len(aside(directory)) == 1
    journal.close(remove=False)
