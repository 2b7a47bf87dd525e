"""The three jobs with real local Spark over a log a real kcoord wrote for stock clients (conftest.py):
the snapshot equals OffsetFetch, a resharded log served by a fresh kcoord answers the same, history
finds the idle partition and not the moving ones, and a corrupt batch is reported."""

import argparse
import io
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient

from pipeline.cli import add_jobs, run
from pipeline.output import CSV_OPTIONS
from pipeline.reader import read_offsets_log
from protocol.partitioning import partition_for
from protocol.records import (
    GroupMetadataRecord,
    OffsetAndMetadata,
    OffsetCommitRecord,
    OffsetKey,
    decode_record,
    encode_record,
)
from storage.batchwriter import build_batch
from storage.log import PartitionLog
from tests.kcoord_process import REPO, KcoordProcess
from tests.pipeline.conftest import IDLE, MOVING, CommittedLog, Offsets, offset_fetch
from tests.storage import test_journal


def job(spark: Any, *argv: str) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    add_jobs(parser)
    err = io.StringIO()
    code = run(parser.parse_args(list(argv)), err=err, spark=spark)
    return code, err.getvalue()


def served(directory: Path, partitions: int, groups: list[str]) -> tuple[dict[str, Offsets], set[str]]:
    """What a fresh kcoord serving ``directory`` answers: OffsetFetch for each group, and ListGroups."""
    server = KcoordProcess(directory, "--offsets-partitions", str(partitions)).start()
    try:
        admin = KafkaAdminClient(bootstrap_servers=server.bootstrap, request_timeout_ms=10_000)
        try:
            answers = {g: offset_fetch(admin, g) for g in groups}
            listed = {g["group_id"] for g in admin.list_groups()}
        finally:
            admin.close()
        assert server.stop() == 0
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.kill()
    return answers, listed


def snapshot_rows(spark: Any, out: Path, fmt: str = "parquet") -> dict[str, Offsets]:
    got: dict[str, Offsets] = {}
    options = {**CSV_OPTIONS, "inferSchema": "true"} if fmt == "csv" else {}
    for r in spark.read.format(fmt).options(**options).load(str(out)).collect():
        got.setdefault(r["group"], {})[(r["topic"], int(r["partition"]))] = (
            int(r["offset"]), r["metadata"] or "", int(r["leader_epoch"]))
    return got


def test_snapshot_equals_offset_fetch_for_every_group(spark: Any, committed_log: CommittedLog, tmp_path: Path,
                                                      report: Any) -> None:
    out = tmp_path / "snapshot"
    # small ranges: every partition's segment is cut into several, decoded by different tasks
    code, err = job(spark, "snapshot", "--data-dir", str(committed_log.data_dir), "--out", str(out),
                    "--split-bytes", "2048")
    assert code == 0, err
    read = read_offsets_log(spark, [str(committed_log.data_dir)], split_bytes=2048)
    assert len(read.splits) > len(read.segments)
    got = snapshot_rows(spark, out)
    expected = {g: offsets for g, offsets in committed_log.expected.items() if offsets}
    assert got == expected
    assert "kp-7" not in got and "members" in got and len(got) == 17
    report.figure("snapshot offsets", sum(len(v) for v in got.values()), "rows")


def test_a_data_directory_whose_journal_holds_batches_is_refused_unless_told(spark: Any, tmp_path: Path) -> None:
    """A journal that holds batches (a kill -9's) means the logs may lack acknowledged commits and hold
    ones never acknowledged, which kcoord's next start sets aside: a campaign's reshard carried one of
    those into a new data directory, where kcoord served it. The jobs refuse such a directory, naming
    the way out, and read it as it is with ``--ignore-journal`` (saying so)."""
    (tmp_path / "data").mkdir()
    journal, plog = test_journal.opened(tmp_path / "data")
    commit = encode_record(OffsetCommitRecord(OffsetKey("g", "t", 0), OffsetAndMetadata(5, -1, "", 1)))
    test_journal.acknowledged(journal, plog, [build_batch(0, [commit], 1)])
    plog.close()
    journal.close(remove=False)  # as a kill -9 leaves it
    partition_dir = next((tmp_path / "data").glob("__consumer_offsets-*"))
    for given in (tmp_path / "data", partition_dir):  # a whole data directory, or one partition's
        code, err = job(spark, "reshard", "--data-dir", str(given), "--out", str(tmp_path / "out"), "--partitions", "3")
        assert code == 2
        assert f"{tmp_path / 'data' / 'journal'} holds 1 batches that the logs may lack" in err
        assert "--ignore-journal" in err and not (tmp_path / "out").exists()
    code, err = job(spark, "snapshot", "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "out"),
                    "--ignore-journal")
    assert code == 0, err
    assert "holds 1 batches that the logs may lack" in err
    assert snapshot_rows(spark, tmp_path / "out") == {"g": {("t", 0): (5, "", -1)}}


def test_a_data_directory_a_running_kcoord_serves_is_refused(spark: Any, tmp_path: Path) -> None:
    """A running kcoord rewrites and removes segments under a reader (a campaign's snapshot died in a
    Spark worker with ~275 lines of traceback while the cleaner ran; a reshard wrote a stale copy):
    the jobs refuse its directory, also named as a ``file://`` URI (``file://localhost/`` too: it was
    read as another host's, without the check; and percent-encoded, which pyarrow decodes: the check
    looked for a directory named ``%64ata``), naming the process, and hold the lock while they read."""
    server = KcoordProcess(tmp_path / "data").start()
    try:
        data = tmp_path / "data"
        for given in (str(data), f"file://{data}", f"file://localhost{data}", f"FILE://LocalHost{data}",
                      f"FILE://{data}", f"file:{data}", f"file://{data.parent}/%64ata",  # %64: pyarrow reads "d"
                      f"local://{data}"):  # pyarrow's alias for file: (read unchecked: a review's find)
            code, err = job(spark, "snapshot", "--data-dir", given, "--out", str(tmp_path / "out"))
            assert code == 2 and not (tmp_path / "out").exists()
            assert f"{tmp_path / 'data'} is in use by a running kcoord (pid {server.proc.pid})" in err, err  # type: ignore[union-attr]
        assert server.stop() == 0
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.kill()
    code, err = job(spark, "snapshot", "--data-dir", f"file://localhost{tmp_path / 'data'}", "--out",
                    f"file://localhost{tmp_path / 'out'}")
    assert code == 0, err
    assert (tmp_path / "out").is_dir()


def test_a_segment_that_cannot_be_read_is_one_line_not_a_traceback(spark: Any, tmp_path: Path) -> None:
    """A name like a segment's whose file cannot be stat'ed (here a dangling symlink) is a usage error
    naming it, as a missing --data-dir is, not a driver traceback."""
    partition = tmp_path / "data" / "__consumer_offsets-0"
    partition.mkdir(parents=True)
    (partition / "00000000000000000000.log").symlink_to(tmp_path / "gone")
    code, err = job(spark, "snapshot", "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "out"))
    assert code == 2
    assert err.count("\n") == 1 and f"cannot list {partition}" in err and "00000000000000000000.log" in err, err


def test_snapshot_as_csv_with_a_header(spark: Any, committed_log: CommittedLog, tmp_path: Path) -> None:
    out = tmp_path / "csv"
    code, err = job(spark, "snapshot", "--data-dir", str(committed_log.data_dir), "--out", str(out),
                    "--format", "csv")
    assert code == 0, err
    parts = sorted(out.glob("part-*.csv"))
    assert parts and all(p.read_text().startswith("group,topic,partition,offset,leader_epoch,metadata,") for p in parts)
    # the NUL librdkafka appends to commit metadata is kept (Spark's default trimming took it for a space)
    assert snapshot_rows(spark, out, "csv") == {g: offsets for g, offsets in committed_log.expected.items() if offsets}
    assert any("\0" in m for offsets in committed_log.expected.values() for _, m, _ in offsets.values())


def test_reshard_is_served_by_a_fresh_kcoord_with_the_new_partition_count(spark: Any, committed_log: CommittedLog,
                                                                          tmp_path: Path) -> None:
    out = tmp_path / "resharded"
    code, err = job(spark, "reshard", "--data-dir", str(committed_log.data_dir), "--out", str(out),
                    "--partitions", "64", "--split-bytes", "4096")
    assert code == 0, err
    # another host's file:// URI is not a local path: refused, not written relative to the working dir
    code, err = job(spark, "reshard", "--data-dir", str(committed_log.data_dir), "--out",
                    f"file://elsewhere{tmp_path / 'other'}", "--partitions", "3")
    assert code == 2 and "so --out is a local path" in err, err
    assert not (tmp_path / "other").exists() and not (REPO / "elsewhere").exists() \
        and not Path("elsewhere").exists()
    groups_seen: set[str] = set()
    for p in range(64):
        for batch in PartitionLog(out / f"__consumer_offsets-{p}").recover():
            for rec in batch.records:
                record = decode_record(rec.key, rec.value)
                group = record.key.group if isinstance(record, OffsetCommitRecord) else (
                    record.group if isinstance(record, GroupMetadataRecord) else "")
                assert partition_for(group, 64) == p
                groups_seen.add(group)
    assert {"members", "hist", "kp-7"} <= groups_seen  # the deleted group's tombstones moved too
    assert served(out, 64, list(committed_log.expected)) == (committed_log.expected, committed_log.listed)
    # the old count is refused by the new directory, as for any kcoord data directory
    refused = subprocess.run([sys.executable, "-m", "coordinator.cli", "serve", "--data-dir", str(out),
                              "--offsets-partitions", "50", "--listen", "127.0.0.1:0"], cwd=REPO,
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2


def test_history_finds_the_idle_partition_and_not_the_moving_ones(spark: Any, committed_log: CommittedLog,
                                                                  tmp_path: Path) -> None:
    out = tmp_path / "history"
    code, err = job(spark, "history", "--data-dir", str(committed_log.data_dir), "--out", str(out),
                    "--stalled-after", "1500ms")
    assert code == 0, err
    assert "compacted" not in err
    stalled = {(r["group"], r["topic"], r["partition"]): r for r in spark.read.parquet(str(out / "stalled")).collect()}
    idle = stalled[("hist", *IDLE)]
    assert idle["offset"] == 7 and idle["stalled_for_ms"] >= 2000 and idle["recommits"] >= 10
    assert not [k for k in stalled if k[0] == "hist" and (k[1], k[2]) in MOVING]
    rates = spark.read.parquet(str(out / "rates")).filter("group = 'hist' and topic = 'moving'").collect()
    assert sum(r["commits"] for r in rates) >= 20 and sum(r["offset_advance"] for r in rates) > 0
    png = (out / "offset-advance.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000


def corrupt_copy(committed_log: CommittedLog, tmp_path: Path) -> tuple[Path, str, int]:
    """A copy of the log with one byte flipped inside the second batch of the hist group's segment."""
    copy = tmp_path / "damaged"
    shutil.copytree(committed_log.data_dir, copy)
    segment = copy / f"__consumer_offsets-{partition_for('hist', 50)}" / "00000000000000000000.log"
    data = bytearray(segment.read_bytes())
    second = int.from_bytes(data[8:12], "big") + 12
    data[second + 70] ^= 0xFF
    segment.write_bytes(bytes(data))
    return copy, str(segment), second


def test_a_corrupt_batch_is_reported_and_skip_corrupt_proceeds(spark: Any, committed_log: CommittedLog,
                                                                tmp_path: Path) -> None:
    damaged, segment, position = corrupt_copy(committed_log, tmp_path)
    out = tmp_path / "refused"
    code, err = job(spark, "snapshot", "--data-dir", str(damaged), "--out", str(out))
    assert code == 1
    assert f"CORRUPT: {segment} at byte {position}: CRC mismatch" in err and "1 corrupt" in err
    assert not out.exists() and not list(tmp_path.glob("refused.kcoord-tmp-*"))
    code, err = job(spark, "snapshot", "--data-dir", str(damaged), "--out", str(out), "--skip-corrupt")
    assert code == 0 and f"at byte {position}" in err and "skipped 1 corrupt" in err
    got = snapshot_rows(spark, out)
    assert got["kp-0"] == committed_log.expected["kp-0"] and got["hist"][IDLE] == committed_log.expected["hist"][IDLE]


@pytest.mark.slow
def test_kcoord_pipeline_command_exits_non_zero_on_corruption(committed_log: CommittedLog, tmp_path: Path) -> None:
    """The real command line, in its own process with its own Spark (local[1])."""
    damaged, segment, position = corrupt_copy(committed_log, tmp_path)
    result = subprocess.run([sys.executable, "-m", "coordinator.cli", "pipeline", "snapshot", "--data-dir",
                             str(damaged), "--out", str(tmp_path / "out"), "--master", "local[1]"],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr
    assert f"CORRUPT: {segment} at byte {position}" in result.stderr and not (tmp_path / "out").exists()


def test_ctrl_c_ends_the_command_with_one_line_and_no_output(committed_log: CommittedLog, tmp_path: Path) -> None:
    """Ctrl-C at a terminal signals the whole process group (Python and Spark's JVM) while the job runs:
    exit 130, one line saying so, no py4j tracebacks (PySpark's own handler re-entered the py4j call the
    job was blocked in: ~100 lines), and nothing put in place."""
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "coordinator.cli", "pipeline", "snapshot", "--data-dir",
                             str(committed_log.data_dir), "--out", str(out), "--master", "local[1]"],
                            cwd=REPO, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stderr is not None
        lines: list[str] = []
        for line in proc.stderr:  # the job's first line comes once Spark is up and the files are listed
            lines.append(line)
            if line.startswith("kcoord pipeline: snapshot of "):
                break
        os.killpg(proc.pid, signal.SIGINT)
        rest = proc.stderr.read()
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    stderr = "".join(lines) + rest
    assert code == 130, stderr
    assert f"kcoord pipeline snapshot: interrupted; {out} was not put in place" in stderr
    assert "Traceback" not in stderr and "py4j" not in stderr, stderr
    assert not out.exists()


def test_a_kafka_written_log_with_transactions_reads_as_kcoord_serves_it(spark: Any, tmp_path: Path) -> None:
    """Compressed batches, leader epoch 7, committed, aborted and open transactions, a record type kcoord
    does not model: the snapshot equals what kcoord serves from the same files, and so does the log
    resharded to 3 partitions."""
    from tests.coordinator.test_load_kafka_logs import GZIP, kafka_batch, marker, offset
    from tests.pipeline.logs import tombstone, write_partition

    unknown = (b"\x00\x03\x00\x01g", b"\x00\x00")
    source = tmp_path / "kafka"
    write_partition(source / "__consumer_offsets-0", [
        kafka_batch(0, [offset("a", 0, 5), offset("a", 1, 50), offset("b", 0, 1)], compression=GZIP),
        kafka_batch(3, [offset("a", 0, 9)], producer=(9, 0), transactional=True),
        kafka_batch(4, [offset("b", 0, 2)]),
        kafka_batch(5, [marker(commit=False)], producer=(9, 0), transactional=True, control=True),
        kafka_batch(6, [offset("a", 2, 11), offset("b", 1, 3)], producer=(10, 0), transactional=True),
        kafka_batch(8, [tombstone("a", "t", 1), unknown]),
        kafka_batch(10, [marker(commit=True)], producer=(10, 0), transactional=True, control=True),
        kafka_batch(11, [offset("a", 3, 13)], producer=(11, 0), transactional=True),  # still open
    ], checkpoint=False)
    code, err = job(spark, "snapshot", "--data-dir", str(source), "--out", str(tmp_path / "snap"))
    assert code == 0, err
    got = snapshot_rows(spark, tmp_path / "snap")
    assert got == {"a": {("t", 0): (5, "", -1), ("t", 2): (11, "", -1)}, "b": {("t", 0): (2, "", -1),
                                                                               ("t", 1): (3, "", -1)}}
    code, err = job(spark, "reshard", "--data-dir", str(source), "--out", str(tmp_path / "three"), "--partitions", "3")
    assert code == 0 and "left out 2 aborted or open" in err and "1 records of types" in err, err
    for directory, partitions in ((source, 1), (tmp_path / "three", 3)):
        assert served(directory, partitions, list(got))[0] == got


def test_transactions_committed_in_the_other_order_than_written_read_as_kcoord_serves_them(
        spark: Any, tmp_path: Path) -> None:
    """Two producers' transactional offsets for one partition, the older committed last: Kafka keeps the
    newer record (replayEndTransactionMarker compares record offsets), and so does the snapshot. kcoord
    installed the older one at its marker and served it: the two disagreed (a difference the README
    listed). The snapshot, a fresh kcoord on the same files and on the log resharded agree."""
    from tests.coordinator.test_load_kafka_logs import kafka_batch, marker, offset
    from tests.pipeline.logs import write_partition

    source = tmp_path / "kafka"
    write_partition(source / "__consumer_offsets-0", [
        kafka_batch(0, [offset("a", 0, 5), offset("b", 0, 5)]),
        kafka_batch(2, [offset("a", 0, 9), offset("b", 0, 9)], producer=(9, 0), transactional=True),
        kafka_batch(4, [offset("a", 0, 11)], producer=(10, 0), transactional=True),
        kafka_batch(5, [marker(commit=True)], producer=(10, 0), transactional=True, control=True),
        kafka_batch(6, [marker(commit=True)], producer=(9, 0), transactional=True, control=True),
    ], checkpoint=False)
    code, err = job(spark, "snapshot", "--data-dir", str(source), "--out", str(tmp_path / "snap"))
    assert code == 0, err
    got = snapshot_rows(spark, tmp_path / "snap")
    assert got == {"a": {("t", 0): (11, "", -1)}, "b": {("t", 0): (9, "", -1)}}
    code, err = job(spark, "reshard", "--data-dir", str(source), "--out", str(tmp_path / "three"), "--partitions", "3")
    assert code == 0, err
    for directory, partitions in ((source, 1), (tmp_path / "three", 3)):
        assert served(directory, partitions, list(got))[0] == got


class _Crash(Exception):
    pass


def test_a_compaction_swap_interrupted_by_a_crash_is_read_as_kcoord_completes_it(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A crash after the cleaner made its swap durable and deleted the first segment it replaces leaves
    ``<base>-<end>.swap``; kcoord's next start completes the swap. The jobs listed ``.log`` files only,
    so the records only the swap held were missed: snapshot and reshard exited 0 without 5 of 25
    committed offsets (a fault campaign's find)."""
    import storage.cleaner
    from tests.pipeline.logs import T, commit, plain_batches, write_partition

    directory = tmp_path / "data" / "__consumer_offsets-0"
    entries = [[commit(f"early-{i}", "t", 0, 1000 + i)] for i in range(20)]
    entries += [[commit("busy", "t", p, r) for p in range(4)] for r in range(200)]
    write_partition(directory, plain_batches(entries), segment_bytes=2048)
    plog = PartitionLog(directory, 2048)
    for _ in plog.recover():
        pass

    def crash_after_the_first(originals: list[Any]) -> None:
        originals[0].path.unlink()
        raise _Crash()

    monkeypatch.setattr(storage.cleaner, "_delete_originals", crash_after_the_first)
    with pytest.raises(_Crash):
        storage.cleaner.clean(plog, T, 86_400_000)
    plog.close()
    assert list(directory.glob("*.swap"))
    code, err = job(spark, "snapshot", "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "snap"))
    assert code == 0, err
    got = snapshot_rows(spark, tmp_path / "snap")
    code, err = job(spark, "reshard", "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "three"),
                    "--partitions", "3")
    assert code == 0, err
    groups = ["busy", *(f"early-{i}" for i in range(20))]
    expected = {"busy": {("t", p): (199, "", -1) for p in range(4)},
                **{f"early-{i}": {("t", 0): (1000 + i, "", -1)} for i in range(20)}}
    assert got == expected
    assert served(tmp_path / "three", 3, groups)[0] == expected
    assert served(tmp_path / "data", 1, groups)[0] == expected  # kcoord completes the swap itself


def test_a_reshard_task_retried_after_a_failure_writes_its_partition_afresh(tmp_path: Path) -> None:
    """Spark retries a failed task: its second attempt appended to what the first had written, and
    kcoord then refused the partition (batch offsets starting over); the job had exited 0 (a fault
    campaign's find). Each attempt now writes its own copy, renamed into place when complete."""
    from pipeline.reshard import LocalStaging, _TargetWriter
    from tests.pipeline.logs import T, commit

    staging = LocalStaging(tmp_path / "out", 1)
    rows = [commit(f"g-{i}", "t", 0, i) for i in range(50)]

    def attempt(upto: int) -> _TargetWriter:
        """One task attempt writing target partition 0 from the first ``upto`` rows."""
        writer = _TargetWriter(staging.directory, 0, 1 << 20)
        for i, (key, value) in enumerate(rows[:upto]):
            writer.add(T + i // 10, key, value)
        return writer

    failed = attempt(30)
    failed.flush()  # written, then the attempt fails: never closed
    assert attempt(50).close()["records"] == 50  # the retry
    attempt(50).close()  # a speculative copy finishing last
    failed.log.close()
    staging.commit()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["__consumer_offsets-0", "kcoord.meta.json"]
    groups = [f"g-{i}" for i in range(50)]
    assert served(tmp_path / "out", 1, groups)[0] == {f"g-{i}": {("t", 0): (i, "", -1)} for i in range(50)}


def test_a_csv_snapshot_keeps_every_value_as_it_is(spark: Any, tmp_path: Path) -> None:
    """Spark's CSV defaults trimmed spaces around values (groups "" and " " merged into one), escaped
    quotes with a backslash that other CSV readers take for a field's end, and the row count read
    back split values holding line breaks (a fault campaign's find). Read with Python's csv module."""
    import csv

    from tests.pipeline.logs import commit, plain_batches, write_partition

    values = {"": " padded metadata ", " ": "", "  lead": 'quo"te', "trail  ": "two\nlines", 'c,"q"\nx': "nul\x00",
              "plain": "ü ✓"}
    write_partition(tmp_path / "data" / "__consumer_offsets-0",
                    plain_batches([[commit(g, "t", 0, i, m)] for i, (g, m) in enumerate(values.items())]))
    code, err = job(spark, "snapshot", "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "csv"),
                    "--format", "csv")
    assert code == 0 and "wrote 6 offsets" in err, err
    got = {}
    for part in sorted((tmp_path / "csv").glob("part-*.csv")):
        with open(part, newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                got[row["group"]] = (row["metadata"], int(row["offset"]))
    assert got == {g: (m, i) for i, (g, m) in enumerate(values.items())}


def test_history_of_a_compacted_log_says_what_compaction_removed(spark: Any, tmp_path: Path) -> None:
    """Compaction keeps each key's last commit: the re-commits that made a partition stalled are gone,
    and history said nothing (a fault campaign's find)."""
    from tests.pipeline.logs import T, commit, plain_batches, write_partition

    batches = plain_batches([[commit("g", "t", 0, 1, ts=T)]]) + plain_batches([[commit("g", "t", 0, 2, ts=T + 60_000)]],
                                                                              first_offset=20, ts=T + 60_000)
    write_partition(tmp_path / "data" / "__consumer_offsets-0", batches)
    code, err = job(spark, "history", "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "history"))
    assert code == 0 and "the log was compacted (19 records removed)" in err, err


def test_what_compaction_removed_is_counted_across_splits_and_segments_once(spark: Any, tmp_path: Path) -> None:
    """A pipeline audit's find: the count missed every gap at a split's or a segment's start (1 where
    ~800 records had gone, with small segments), and a recomputed stage counted its splits again."""
    from storage.batchwriter import build_batch
    from tests.pipeline.logs import T, commit, write_partition

    # one record every 5 offsets: 4 removed before each but the first
    batches = [build_batch(5 * i, [commit("g", "t", i % 7, i)], T) for i in range(300)]
    write_partition(tmp_path / "data" / "__consumer_offsets-0", batches, segment_bytes=4096)
    read = read_offsets_log(spark, [str(tmp_path / "data")], split_bytes=1024)
    assert len(read.segments) > 3 and len(read.splits) > len(read.segments)
    assert read.df.count() == 300
    assert read.removed_by_compaction == 4 * 299
    assert read.df.count() == 300  # computed again: the same splits, counted once
    assert read.removed_by_compaction == 4 * 299


def test_a_snapshot_that_fails_while_writing_leaves_no_staging_directory(
        spark: Any, committed_log: CommittedLog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C or a failed Spark job while the output was written left ``<out>.kcoord-tmp-*`` behind."""
    from pyspark.sql import functions as F

    import pipeline.snapshot

    real = pipeline.snapshot.snapshot

    def failing(read: Any) -> Any:
        return real(read).withColumn("offset", F.udf(lambda offset: 1 // 0, "long")("offset"))

    monkeypatch.setattr(pipeline.snapshot, "snapshot", failing)
    with pytest.raises(Exception, match="ZeroDivisionError"):
        job(spark, "snapshot", "--data-dir", str(committed_log.data_dir), "--out", str(tmp_path / "out"))
    assert list(tmp_path.iterdir()) == []


def test_a_log_kcoord_cuts_on_load_reads_as_kcoord_serves_it(spark: Any, tmp_path: Path) -> None:
    """Damage past the recovery point that kcoord's recovery cuts aside with everything after it (a
    power cut's work in any mode but the journal's, or one read with --ignore-journal): a damaged batch
    with whole ones after it in a segment that is not the last, and in another partition a batch repeated
    at a boundary between splits, where no task sees both. The jobs failed on the first (exit 1, nothing
    written) and read the second as good, serving offsets kcoord never does; now they read again only up
    to where kcoord cuts, and the snapshot, the history and the resharded log answer as kcoord does."""
    from storage.log import RECOVERY_POINT
    from tests.pipeline.logs import commit, plain_batches, write_partition
    from tests.pipeline.test_decode import damage

    groups = {p: next(g for g in (f"g{i}" for i in range(100)) if partition_for(g, 2) == p) for p in (0, 1)}
    batches = {p: plain_batches([[commit(groups[p], "t", q, r) for q in range(3)] for r in range(40)]) for p in (0, 1)}
    size = len(batches[0][0])
    data = tmp_path / "data"
    first = data / "__consumer_offsets-0"
    positions = write_partition(first, batches[0], segment_bytes=20 * size)
    (first / RECOVERY_POINT).write_text(f"0 {positions[10]}\n")
    damage(first / "00000000000000000000.log", positions[15])  # batches 16-19 and the next segment are whole
    second = data / "__consumer_offsets-1"
    positions = write_partition(second, [*batches[1][:6], batches[1][5], *batches[1][6:]], segment_bytes=20 * size)
    (second / RECOVERY_POINT).write_text(f"0 {positions[3]}\n")
    assert positions[6] == 6 * size  # --split-bytes 1000 starts a split there: the repeat is its first batch
    expected = {groups[0]: {("t", q): (14, "", -1) for q in range(3)},
                groups[1]: {("t", q): (5, "", -1) for q in range(3)}}
    split = ("--split-bytes", "1000")
    code, err = job(spark, "snapshot", "--data-dir", str(data), "--out", str(tmp_path / "snap"), *split)
    assert code == 0 and "reading again up to there" in err, err
    assert err.count("torn tail (cut there by kcoord's recovery") == 2 and "CORRUPT" not in err, err
    assert snapshot_rows(spark, tmp_path / "snap") == expected
    code, err = job(spark, "history", "--data-dir", str(data), "--out", str(tmp_path / "hist"), *split)
    assert code == 0, err
    commits = spark.read.parquet(str(tmp_path / "hist" / "rates")).groupBy("group").sum("commits").collect()
    assert {r["group"]: r["sum(commits)"] for r in commits} == {groups[0]: 45, groups[1]: 18}
    code, err = job(spark, "reshard", "--data-dir", str(data), "--out", str(tmp_path / "three"), "--partitions", "3",
                    *split)
    assert code == 0, err
    assert served(tmp_path / "three", 3, list(expected))[0] == expected
    assert served(data, 2, list(expected))[0] == expected  # kcoord itself, cutting the same places aside


def test_a_batch_repeated_at_a_split_start_below_the_recovery_point_is_skipped_as_inside_a_split(
        spark: Any, tmp_path: Path) -> None:
    """With --skip-corrupt a batch whose offsets go back is skipped inside a split, but one that started a
    split (a task cannot tell) was only reported: its rows stayed, and history counted its commits again.
    The job now reads that split again, told where the log had got to."""
    from tests.pipeline.logs import commit, plain_batches, write_partition

    group = "g"
    batches = plain_batches([[commit(group, "t", q, r) for q in range(3)] for r in range(6)])
    size = len(batches[0])
    data = tmp_path / "data"
    positions = write_partition(data / "__consumer_offsets-0", [*batches, batches[2]])  # all below the recovery point
    assert positions[6] == 6 * size  # --split-bytes 1000 starts a split there: the repeat is its first batch
    split = ("--split-bytes", "1000")
    code, err = job(spark, "snapshot", "--data-dir", str(data), "--out", str(tmp_path / "refused"), *split)
    assert code == 1 and "CORRUPT" in err and "below expected 18" in err, err
    code, err = job(spark, "snapshot", "--data-dir", str(data), "--out", str(tmp_path / "snap"), "--skip-corrupt",
                    *split)
    assert code == 0 and "reading again without them" in err and err.count("CORRUPT") == 1, err
    assert snapshot_rows(spark, tmp_path / "snap") == {group: {("t", q): (5, "", -1) for q in range(3)}}
    code, err = job(spark, "history", "--data-dir", str(data), "--out", str(tmp_path / "hist"), "--skip-corrupt",
                    *split)
    assert code == 0 and "reading again without them" in err, err
    commits = spark.read.parquet(str(tmp_path / "hist" / "rates")).groupBy("group").sum("commits").collect()
    assert {r["group"]: r["sum(commits)"] for r in commits} == {group: 18}
    read = read_offsets_log(spark, [str(data)], split_bytes=1000)
    assert read.df.count() == 21 and (again := read.cut_read()) is not None
    assert again.df.count() == 18 and again.cut_read() is None
    assert [(d.position, d.torn_tail) for d in again.damages()] == [(positions[6], False)]


def test_a_batch_repeated_at_a_segments_start_below_the_recovery_point_is_skipped(spark: Any, tmp_path: Path) -> None:
    """The same at a segment's start: a segment rolled at a repeat of the batch before (its base offset is
    the repeat's, inside the segment before it). kcoord's recovery reads it as offsets going back; the
    split that starts the segment was told where the log had got to, but walked from the segment's base
    offset all the same, so its rows stayed."""
    from tests.pipeline.logs import commit, plain_batches, write_partition

    batches = plain_batches([[commit("g", "t", q, r) for q in range(3)] for r in range(4)])
    data = tmp_path / "data"
    directory = data / "__consumer_offsets-0"
    write_partition(directory, [*batches[:2], batches[1], *batches[2:]], segment_bytes=2 * len(batches[0]))
    assert (directory / "00000000000000000003.log").exists()  # the repeat of offsets 3-5 starts a segment
    read = read_offsets_log(spark, [str(data)])
    assert read.df.count() == 15 and (again := read.cut_read()) is not None
    assert again.df.count() == 12 and again.cut_read() is None
    assert [(Path(d.path).name, d.position, d.torn_tail) for d in again.damages()] == [
        ("00000000000000000003.log", 0, False)]
    code, err = job(spark, "snapshot", "--data-dir", str(data), "--out", str(tmp_path / "snap"), "--skip-corrupt")
    assert code == 0 and "reading again without them" in err and err.count("CORRUPT") == 1, err
    assert snapshot_rows(spark, tmp_path / "snap") == {"g": {("t", q): (3, "", -1) for q in range(3)}}


def test_a_split_read_again_from_where_the_log_got_to_reports_its_damages_once(spark: Any, tmp_path: Path) -> None:
    """A split read again told where the log had got to walks its batches anew, and the damages it finds
    are the ones that count: those its first read found inside it were judged from the repeat it took
    for the log's progress (here "6 below expected 8", after 3 and 7 were read as in order), and kept
    beside the new ones ("6 below expected 10"), the same batch was reported twice."""
    from tests.pipeline.logs import commit, plain_batches, write_partition

    batches = plain_batches([[commit("g", "t", 0, r)] for r in range(12)])
    size = len(batches[0])
    data = tmp_path / "data"
    log = [*batches[:10], batches[3], batches[7], batches[6], *batches[10:]]
    positions = write_partition(data / "__consumer_offsets-0", log)
    read = read_offsets_log(spark, [str(data)], split_bytes=10 * size)
    assert [s.start for s in read.splits] == [0, positions[10]]  # the repeat of offset 3 starts the second split
    assert read.df.count() == 14 and (again := read.cut_read()) is not None  # 6 skipped: below 8
    assert again.df.count() == 12 and again.cut_read() is None
    assert [(d.position, d.reason) for d in again.damages()] == [
        (positions[10], "batch offset 3 below expected 10"), (positions[11], "batch offset 7 below expected 10"),
        (positions[12], "batch offset 6 below expected 10")]
