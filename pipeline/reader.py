"""An offsets log as a DataFrame, decoded on the executors.

The driver only lists segments and plans: segments above the split size are walked header to header by
one Spark task each (``splits.batch_boundaries``), then every range is decoded by ``decode.rows`` inside
``mapInArrow`` (one task per packed group of ranges), which hands Arrow batches straight to the JVM.
Damaged batches and unreadable records go to an accumulator: ``LogRead.damages()`` lists them, each once
(a stage that is recomputed reports the same damage again).
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TextIO

import pyarrow as pa
from pyspark.accumulators import Accumulator, AccumulatorParam
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from pipeline import decode
from pipeline.layout import SegmentFile, describe, files_for, find_segments
from pipeline.splits import Split, batch_boundaries, pack, ranges, split_bytes_for

ROWS_PER_BATCH = 32_768


class _ListParam(AccumulatorParam[list[decode.Damage]]):
    def zero(self, value: list[decode.Damage]) -> list[decode.Damage]:
        return []

    def addInPlace(self, value1: list[decode.Damage], value2: list[decode.Damage]) -> list[decode.Damage]:
        value1.extend(value2)
        return value1


@dataclass
class LogRead:
    """A decoded log: the DataFrame (lazy) and what its reading found."""

    df: DataFrame
    segments: list[SegmentFile]
    splits: list[Split]
    tasks: int
    split_bytes: int
    _damages: Accumulator[list[decode.Damage]]
    _records: Accumulator[int]
    _removed: Accumulator[int]

    def damages(self) -> list[decode.Damage]:
        """Every damage found so far (the DataFrame must have been computed), by file and position."""
        return sorted(set(self._damages.value), key=lambda d: (d.log_partition, d.path, d.position))

    @property
    def records_read(self) -> int:
        """Records decoded by the computations so far (a recomputed stage counts again)."""
        return int(self._records.value)

    @property
    def removed_by_compaction(self) -> int:
        """Offsets between records that hold none, in what was read so far: records compaction removed."""
        return int(self._removed.value)

    def summary(self) -> str:
        facts = describe(self.segments)
        return (f"{facts['partitions']} partitions, {facts['segments']} segments, {facts['bytes']:,} bytes; "
                f"{len(self.splits)} splits in {self.tasks} tasks (split size {self.split_bytes:,} bytes)")


def read_offsets_log(spark: SparkSession, paths: list[str], columns: tuple[str, ...] = decode.COLUMNS,
                     split_bytes: int | None = None, latest_only: bool = False) -> LogRead:
    """The records of the offsets log under ``paths`` with ``columns`` (see ``decode.RECORD_SCHEMA``).
    ``latest_only``: the snapshot's map-side combine (``decode.latest_per_key``)."""
    sc = spark.sparkContext
    segments = [s for s in find_segments(paths) if s.size > 0]
    parallelism = sc.defaultParallelism
    size = split_bytes or split_bytes_for(sum(s.size for s in segments), parallelism)
    splits = plan(spark, segments, size)
    tasks = pack(splits, size, parallelism)
    damages: Accumulator[list[decode.Damage]] = sc.accumulator([], _ListParam())
    records: Accumulator[int] = sc.accumulator(0)
    removed: Accumulator[int] = sc.accumulator(0)
    schema = from_arrow_schema(decode.schema_of(columns))
    if not tasks:
        df = spark.createDataFrame([], schema)
    else:
        # one row per task, one task per Spark partition (range() splits evenly): the splits travel in
        # the function's closure, so no Python step runs before the decoding itself
        task_ids = spark.range(0, len(tasks), 1, len(tasks))
        df = task_ids.mapInArrow(_decoder(tasks, columns, latest_only, damages, records, removed), schema)
    return LogRead(df, segments, splits, len(tasks), size, damages, records, removed)


def plan(spark: SparkSession, segments: list[SegmentFile], split_bytes: int) -> list[Split]:
    """Ranges of every segment; the large ones are walked for batch boundaries on the executors."""
    big = [s for s in segments if s.size > split_bytes]
    cuts: dict[str, list[int]] = {}
    if big:
        def walk(segment: SegmentFile) -> tuple[str, list[int]]:
            files = files_for(segment.path)
            return segment.path, batch_boundaries(lambda start, n: files.read(segment.path, start, n),
                                                  segment.size, split_bytes)

        cuts = dict(spark.sparkContext.parallelize(big, len(big)).map(walk).collect())
    out: list[Split] = []
    for seg in segments:
        out.extend(ranges(seg, cuts.get(seg.path, [0])))
    return out


def _decoder(tasks: list[list[Split]], columns: tuple[str, ...], latest_only: bool,
             damages: Accumulator[list[decode.Damage]], records: Accumulator[int],
             removed: Accumulator[int]) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        found: list[decode.Damage] = []
        count = 0

        def task_rows() -> Iterator[decode.Row]:
            nonlocal count
            for batch in batches:
                for task in batch.column(0).to_pylist():
                    for split in tasks[task]:
                        for r in decode.rows(split, files_for(split.segment.path), found.append, removed.add):
                            count += 1
                            yield r

        stream = decode.latest_per_key(task_rows()) if latest_only else task_rows()
        chunk: list[decode.Row] = []
        for r in stream:
            chunk.append(r)
            if len(chunk) >= ROWS_PER_BATCH:
                yield decode.to_batch(chunk, columns)
                chunk = []
        if chunk:
            yield decode.to_batch(chunk, columns)
        damages.add(found)
        records.add(count)

    return run


def report_damages(read: LogRead, err: TextIO) -> int:
    """Prints every damage found (file and byte position) and returns how many are corruption (torn
    tails, which kcoord's recovery cuts aside, are listed but not counted)."""
    corrupt = 0
    for d in read.damages():
        kind = "torn tail (never acknowledged, ignored)" if d.torn_tail else "CORRUPT"
        corrupt += not d.torn_tail
        print(f"kcoord pipeline: {kind}: {d.path} at byte {d.position}: {d.reason}", file=err)
    return corrupt
