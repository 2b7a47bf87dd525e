"""``reshard``: the whole log rewritten for another partition count, as a data directory kcoord serves.

Kafka cannot change ``offsets.topic.num.partitions`` once the topic exists; this is how a kcoord user
grows past it: stop kcoord, reshard, start kcoord on the new directory with ``--offsets-partitions N``.

Every offset-commit and group-metadata record (tombstones included) moves to ``partition_for(group, N)``
with its key and value bytes unchanged. Rows are shuffled by target partition and sorted by their source
(log partition, offset): all of a group's records come from one source partition, so each group keeps its
order. Each target partition is written by one task through ``storage.log.PartitionLog`` as uncompressed
v2 batches (``storage.batchwriter.build_batch``, records sharing a timestamp share a batch), fsynced, with its
recovery point. Committed transactional offsets are written as plain commits at their place; aborted and
still open ones, control markers and record types kcoord does not model (it skips them on load) are left
out and counted. The output is assembled in a staging directory next to ``--out`` with
``kcoord.meta.json`` and renamed into place, so it appears complete or not at all. The output is a local
path (a directory kcoord can serve); on a cluster it must be a path every executor shares.
"""

import argparse
import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from pipeline import decode
from pipeline.decode import GROUP_METADATA, OFFSET_COMMIT, UNKNOWN
from pipeline.layout import META_FILE, OFFSETS_TOPIC, local_path
from pipeline.output import OutputError, say, settle, skipped
from pipeline.reader import cut_note, read_offsets_log, report_damages
from pipeline.semantics import TRANSACTION_COLUMNS, with_counts
from protocol.partitioning import partition_for
from storage.batchwriter import build_batch
from storage.log import PartitionLog
from storage.segments import fsync_path

READ_COLUMNS = tuple(dict.fromkeys(("group", "timestamp", "key", "value", *TRANSACTION_COLUMNS)))
WRITE_COLUMNS = ("target", "log_partition", "record_type", "timestamp", "key", "value")
MAX_BATCH_RECORDS = 1000
MAX_BATCH_BYTES = 512 * 1024  # well under Kafka's default max.message.bytes (1 MiB)
SUMMARY = pa.schema([("target", pa.int32()), ("records", pa.int64()), ("batches", pa.int64()),
                     ("bytes", pa.int64()), ("dropped_transactional", pa.int64()), ("dropped_unknown", pa.int64())])
SUMMARY_DDL = ("target int, records bigint, batches bigint, bytes bigint, dropped_transactional bigint, "
               "dropped_unknown bigint")


def targets(rows: DataFrame, partitions: int) -> DataFrame:
    """``rows`` with ``target``: the new partition of each record to move, null for those left out."""
    carried = ("log_partition", "log_offset", "record_type", "timestamp", "key", "value")
    schema = pa.schema([*(decode.RECORD_SCHEMA.field(c) for c in carried), ("target", pa.int32())])

    def add_target(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        known: dict[str, int] = {}  # group ids repeat: hash each once
        for batch in batches:
            groups, counts = batch.column("group").to_pylist(), batch.column("counts").to_pylist()
            target = [(known[g] if g in known else known.setdefault(g, partition_for(g, partitions)))
                      if c and g is not None else None for g, c in zip(groups, counts, strict=True)]
            yield pa.RecordBatch.from_arrays([*(batch.column(c) for c in carried), pa.array(target, pa.int32())],
                                             schema=schema)

    moved = with_counts(rows, (OFFSET_COMMIT, GROUP_METADATA)).select(*carried, "group", "counts")
    return moved.mapInArrow(add_target, from_arrow_schema(schema))


class _TargetWriter:
    """Writes the rows of one target partition, in order, as batches of records sharing a timestamp.

    Into a directory of its own task attempt, renamed into place once complete: Spark retries a failed
    task (and may run a speculative copy beside it), and a retry appending to what the failed attempt
    had written made a log kcoord refuses to load ("batch offset 0 below expected"), the job exiting 0
    (a fault campaign's find). An attempt finding its partition already in place (another attempt of the
    same task finished it: the same rows in the same order) drops its own copy."""

    def __init__(self, directory: Path, target: int, segment_bytes: int) -> None:
        self.final = directory / f"{OFFSETS_TOPIC}-{target}"
        self.attempt = directory / f".attempt-{uuid.uuid4().hex}" / self.final.name
        self.log = PartitionLog(self.attempt, segment_bytes)
        self.target = target
        self.next_offset = self.batches = self.bytes = 0
        self.pending: list[tuple[bytes, bytes | None]] = []
        self.pending_bytes = 0
        self.timestamp = -1

    def add(self, timestamp: int, key: bytes, value: bytes | None) -> None:
        size = len(key) + (len(value) if value is not None else 0)
        full = len(self.pending) >= MAX_BATCH_RECORDS or self.pending_bytes + size > MAX_BATCH_BYTES
        if self.pending and (timestamp != self.timestamp or full):
            self.flush()
        self.timestamp = timestamp
        self.pending.append((key, value))
        self.pending_bytes += size

    def flush(self) -> None:
        if not self.pending:
            return
        batch = build_batch(self.next_offset, self.pending, self.timestamp)
        self.log.append(batch, self.next_offset + len(self.pending) - 1)
        self.next_offset += len(self.pending)
        self.batches += 1
        self.bytes += len(batch)
        self.pending, self.pending_bytes = [], 0

    def close(self) -> dict[str, int]:
        """Flushes, fsyncs, records the recovery point; the summary of what was written."""
        self.flush()
        self.log.sync()
        self.log.checkpoint()
        self.log.close()
        try:
            os.rename(self.attempt, self.final)
        except OSError:  # another attempt put the same partition in place first
            if not self.final.is_dir():
                raise
        else:
            fsync_path(self.final.parent)
        shutil.rmtree(self.attempt.parent, ignore_errors=True)
        return {"target": self.target, "records": self.next_offset, "batches": self.batches, "bytes": self.bytes,
                "dropped_transactional": 0, "dropped_unknown": 0}


def _writer(directory: str, segment_bytes: int) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        summaries: list[dict[str, int]] = []
        left_out = {"dropped_transactional": 0, "dropped_unknown": 0}
        current: _TargetWriter | None = None
        for batch in batches:
            cols = [batch.column(name).to_pylist() for name in WRITE_COLUMNS]
            for target, _, record_type, timestamp, key, value in zip(*cols, strict=True):
                if target is None:
                    if record_type == UNKNOWN:
                        left_out["dropped_unknown"] += 1
                    elif record_type == OFFSET_COMMIT:
                        left_out["dropped_transactional"] += 1
                    continue
                if current is None or current.target != target:
                    if current is not None:
                        summaries.append(current.close())
                    current = _TargetWriter(Path(directory), target, segment_bytes)
                current.add(timestamp, key, value)
        if current is not None:
            summaries.append(current.close())
        summaries.append({"target": -1, "records": 0, "batches": 0, "bytes": 0, **left_out})
        yield pa.RecordBatch.from_pylist(summaries, schema=SUMMARY)

    return run


def reshard(rows: DataFrame, partitions: int, directory: Path, segment_bytes: int) -> list[dict[str, Any]]:
    """Writes every target partition under ``directory``; one summary per partition written (and one
    with target -1 per task counting what was left out)."""
    moving = targets(rows, partitions).select(*WRITE_COLUMNS, "log_offset")
    tasks = max(1, min(partitions, rows.sparkSession.sparkContext.defaultParallelism * 4))
    ordered = moving.repartition(tasks, "target").sortWithinPartitions("target", "log_partition", "log_offset")
    return [r.asDict() for r in ordered.mapInArrow(_writer(str(directory), segment_bytes), SUMMARY_DDL).collect()]


def finish_data_dir(directory: Path, partitions: int) -> None:
    """Every partition directory (empty ones too) and ``kcoord.meta.json``, all fsynced."""
    for p in range(partitions):
        part = directory / f"{OFFSETS_TOPIC}-{p}"
        if not part.exists():
            part.mkdir()
            fsync_path(part)
    with open(directory / META_FILE, "w") as f:
        f.write(json.dumps({"offsets_partitions": partitions}) + "\n")
        f.flush()
        os.fsync(f.fileno())
    fsync_path(directory)


class LocalStaging:
    """``<out>.kcoord-tmp-<id>`` beside ``out``; committed by completing it as a data directory and
    renaming it into place."""

    def __init__(self, out: Path, partitions: int) -> None:
        if out.exists():
            raise OutputError(f"{out} exists already: give a new path")
        self.out, self.partitions = out, partitions
        self.directory = out.with_name(f"{out.name}.kcoord-tmp-{uuid.uuid4().hex[:8]}")
        self.directory.mkdir(parents=True)

    def commit(self) -> None:
        for left in self.directory.glob(".attempt-*"):  # by task attempts that failed
            shutil.rmtree(left)
        finish_data_dir(self.directory, self.partitions)
        os.rename(self.directory, self.out)
        fsync_path(self.out.parent)

    def discard(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def run(spark: SparkSession, args: argparse.Namespace, err: TextIO) -> int:
    out = local_path(args.out)
    if out is None:  # another file system, or a file:// URI naming another host
        raise OutputError(f"{args.out}: reshard writes a data directory kcoord serves, so --out is a local path")
    staging = LocalStaging(out.absolute(), args.partitions)
    try:
        read = read_offsets_log(spark, args.data_dir, READ_COLUMNS, args.split_bytes)
        say(f"reshard to {args.partitions} partitions of {read.summary()}", err)
        summaries = reshard(read.df, args.partitions, staging.directory, args.segment_bytes)
        while (again := read.cut_read()) is not None:
            staging.discard()
            staging = LocalStaging(out.absolute(), args.partitions)
            say(cut_note(again, read), err)
            read = again
            summaries = reshard(read.df, args.partitions, staging.directory, args.segment_bytes)
        corrupt = report_damages(read, err)
        if not settle(staging, corrupt, args.skip_corrupt, err):
            return 1
    except BaseException:
        staging.discard()
        raise
    written = [s for s in summaries if s["target"] >= 0]
    say(f"wrote {sum(s['records'] for s in written):,} records in {sum(s['batches'] for s in written):,} batches "
        f"({sum(s['bytes'] for s in written):,} bytes) to {len(written)} of {args.partitions} partitions in "
        f"{staging.out}; left out {sum(s['dropped_transactional'] for s in summaries)} aborted or open "
        f"transactional commits and {sum(s['dropped_unknown'] for s in summaries)} records of types kcoord does "
        "not model" + skipped(corrupt), err)
    say(f"serve it with: kcoord serve --data-dir {staging.out} --offsets-partitions {args.partitions}", err)
    return 0
