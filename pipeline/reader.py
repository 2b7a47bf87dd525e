"""An offsets log as a DataFrame, decoded on the executors.

The driver only lists segments and plans: segments above the split size are walked header to header by
one Spark task each (``splits.batch_boundaries``), then every range is decoded by ``decode.rows`` inside
``mapInArrow`` (one task per packed group of ranges), which hands Arrow batches straight to the JVM.
Damaged batches and unreadable records go to an accumulator: ``LogRead.damages()`` lists them, each once
(a stage that is recomputed reports the same damage again).

kcoord's recovery cuts a partition at the first damage past its recovery point and sets aside everything
after it, later segments included (storage.log ``recover``). A split stops at such a damage itself, but
the splits after it are read by other tasks, which cannot know. So each split also says what it read
(``decode.SplitRead``), and once a job has computed its output ``LogRead.cut_read()`` checks them in log
order: a batch whose offsets go back across splits is damage as well, and if anything past a cut was
read the job discards its staged output and reads again only up to the cuts (``plan``'s ``cuts``). A
batch repeated at a split's start below the recovery point is corruption, which ``--skip-corrupt`` skips
as it does inside a split; its rows were read, so the job reads again with that split told where the log
had got to (``plan``'s ``starts``). That costs a second read only for such logs; reading every log twice
to find its cuts first would cost it always.
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TextIO

import pyarrow as pa
from pyspark.accumulators import Accumulator, AccumulatorParam
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from pipeline import decode
from pipeline.layout import SegmentFile, describe, files_for, find_segments
from pipeline.splits import Split, batch_boundaries, pack, ranges, split_bytes_for

ROWS_PER_BATCH = 32_768
Cut = tuple[int, int]  # (segment base offset, byte position): where kcoord's recovery cuts a partition
Starts = dict[tuple[str, int], int]  # (segment path, split start) -> the offset the log had got to there


class _ListParam(AccumulatorParam[list[Any]]):
    def zero(self, value: list[Any]) -> list[Any]:
        return []

    def addInPlace(self, value1: list[Any], value2: list[Any]) -> list[Any]:
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
    _reads: Accumulator[list[decode.SplitRead]]
    _again: Callable[[dict[int, Cut], Starts, list[decode.Damage]], "LogRead"]
    cuts: dict[int, Cut]  # the partitions this read stops short of their end, and where
    starts: Starts  # splits whose first batches this read checked against the splits before them
    _found: list[decode.Damage]  # found by ``cut_read`` across splits, or by the read before this one
    # each partition's first offset: its lowest segment base offset, of empty segments too (the cleaner
    # leaves a segment whose records it all removed as an empty file, which is not read)
    log_starts: dict[int, int]

    def damages(self) -> list[decode.Damage]:
        """Every damage found so far (the DataFrame must have been computed), by file and position."""
        return sorted(set(self._damages.value) | set(self._found), key=lambda d: (d.log_partition, d.path, d.position))

    def cut_read(self) -> "LogRead | None":
        """Once the DataFrame has been computed: None if it holds nothing kcoord's recovery would cut away
        and no batch a split should have skipped, else a new read (lazy) of the same log that stops at
        every cut and tells such splits where the log had got to. Checks the splits in log order, as
        storage.log's ``recover`` reads the log: a split's first batch below where the split before it got
        to is damage too (a split inside a segment cannot tell), corruption below the recovery point
        (skipped, as inside a split), a cut past it."""
        segments = {s.path: s for s in self.segments}
        reads = self._reads_in_log_order()
        cuts: dict[int, Cut] = {}
        starts: Starts = {}
        past_cut = False
        partition, expected, cut = -1, -1, None
        for r in reads:
            if r.log_partition != partition:
                partition, expected, cut = r.log_partition, -1, None
            if cut is not None:
                past_cut = past_cut or r.first_position >= 0
                continue
            if r.start == 0:
                expected = max(expected, r.base_offset)
            if 0 <= r.first_offset < expected:
                found = decode.Damage(r.path, partition, r.first_position,
                                      f"batch offset {r.first_offset} below expected {expected}",
                                      r.first_position >= segments[r.path].durable_below)
                self._found.append(found)
                if found.torn_tail:
                    cut = cuts[partition] = (r.base_offset, r.first_position)
                    past_cut = True  # the split read from there
                    continue
                if (r.path, r.start) not in self.starts:  # its rows were read: read it again skipping them
                    starts[(r.path, r.start)] = expected
            if r.cut_position >= 0:
                cut = cuts[partition] = (r.base_offset, r.cut_position)
            if r.next_offset >= 0:
                expected = max(expected, r.next_offset)
        starts = {k: v for k, v in starts.items() if segments[k[0]].log_partition not in cuts}
        if not past_cut and not starts:
            return None
        # A split read again from where the log had got to finds its damages anew: those this read found in
        # it went by the batches it now skips (a damage's reason names the offset expected), kept they would
        # be reported beside the new ones
        again = [(s.segment.path, s.start, s.end) for s in self.splits if (s.segment.path, s.start) in starts]
        before = [d for d in self.damages() if (d.log_partition not in cuts
                  or (segments[d.path].base_offset, d.position) <= cuts[d.log_partition])
                  and not any(d.path == path and start <= d.position < end for path, start, end in again)]
        return self._again({**self.cuts, **cuts}, {**self.starts, **starts}, before)

    def _reads_in_log_order(self) -> list[decode.SplitRead]:
        """What each split read, once each (a recomputed stage reports its splits again), in log order."""
        return sorted(set(self._reads.value), key=lambda r: (r.log_partition, r.base_offset, r.start))

    @property
    def records_read(self) -> int:
        """Records decoded by the computations so far (a recomputed stage counts again)."""
        return int(self._records.value)

    @property
    def removed_by_compaction(self) -> int:
        """Offsets before and between records that hold none, in what was read so far (once the DataFrame
        has been computed): records compaction removed. From each split's own count and the gaps between
        splits and at a log's start, in log order; a split read twice (a stage recomputed) counts once,
        and nothing past a cut or across one is counted. A log starts at its lowest segment base offset,
        an empty segment's included: those the cleaner emptied were not counted (a pipeline campaign's find)."""
        starts = self.log_starts
        reads = self._reads_in_log_order()
        removed, partition, last, cut = 0, -1, -1, False
        for r in reads:
            if r.log_partition != partition:
                partition, last, cut = r.log_partition, starts.get(r.log_partition, 0) - 1, False
            if cut or r.first_record < 0:
                cut = cut or r.cut_position >= 0
                continue
            removed += max(r.first_record - last - 1, 0) + r.removed
            last = r.last_record
            cut = r.cut_position >= 0
        return removed

    def summary(self) -> str:
        facts = describe(self.segments)
        return (f"{facts['partitions']} partitions, {facts['segments']} segments, {facts['bytes']:,} bytes; "
                f"{len(self.splits)} splits in {self.tasks} tasks (split size {self.split_bytes:,} bytes)")


def read_offsets_log(spark: SparkSession, paths: list[str], columns: tuple[str, ...] = decode.COLUMNS,
                     split_bytes: int | None = None, latest_only: bool = False, cuts: dict[int, Cut] | None = None,
                     starts: Starts | None = None, found: list[decode.Damage] | None = None) -> LogRead:
    """The records of the offsets log under ``paths`` with ``columns`` (see ``decode.RECORD_SCHEMA``).
    ``latest_only``: the snapshot's map-side combine (``decode.latest_per_key``). ``cuts``: partitions to
    read only up to a cut, ``starts``: splits told where the log had got to (both ``LogRead.cut_read``),
    ``found`` the damages the read before found."""
    sc = spark.sparkContext
    cuts = cuts or {}
    starts = starts or {}
    found_segments = find_segments(paths)
    log_starts: dict[int, int] = {}
    for s in found_segments:
        log_starts[s.log_partition] = min(log_starts.get(s.log_partition, s.base_offset), s.base_offset)
    segments = [s for s in found_segments if s.size > 0]
    parallelism = sc.defaultParallelism
    size = split_bytes or split_bytes_for(sum(s.size for s in segments), parallelism)
    splits = plan(spark, segments, size, cuts, starts)
    tasks = pack(splits, size, parallelism)
    damages: Accumulator[list[decode.Damage]] = sc.accumulator([], _ListParam())
    records: Accumulator[int] = sc.accumulator(0)
    reads: Accumulator[list[decode.SplitRead]] = sc.accumulator([], _ListParam())
    schema = from_arrow_schema(decode.schema_of(columns))
    if not tasks:
        df = spark.createDataFrame([], schema)
    else:
        # one row per task, one task per Spark partition (range() splits evenly): the splits travel in
        # the function's closure, so no Python step runs before the decoding itself
        task_ids = spark.range(0, len(tasks), 1, len(tasks))
        df = task_ids.mapInArrow(_decoder(tasks, columns, latest_only, damages, records, reads), schema)

    def again(new_cuts: dict[int, Cut], new_starts: Starts, before: list[decode.Damage]) -> LogRead:
        return read_offsets_log(spark, paths, columns, split_bytes, latest_only, new_cuts, new_starts, before)

    return LogRead(df, segments, splits, len(tasks), size, damages, records, reads, again, cuts, starts,
                   list(found or []), log_starts)


def plan(spark: SparkSession, segments: list[SegmentFile], split_bytes: int,
         cuts: dict[int, Cut] | None = None, starts: Starts | None = None) -> list[Split]:
    """Ranges of every segment; the large ones are walked for batch boundaries on the executors. A
    partition in ``cuts`` ends where it is cut: ranges from there on are left out, the one it falls in
    ends there. A range in ``starts`` knows the offset the log had got to at its start."""
    cuts = cuts or {}
    starts = starts or {}
    segments = [s for s in segments if s.log_partition not in cuts or s.base_offset <= cuts[s.log_partition][0]]
    big = [s for s in segments if s.size > split_bytes]
    boundaries: dict[str, list[int]] = {}
    if big:
        def walk(segment: SegmentFile) -> tuple[str, list[int]]:
            files = files_for(segment.path)
            return segment.path, batch_boundaries(lambda start, n: files.read(segment.path, start, n),
                                                  segment.size, split_bytes)

        boundaries = dict(spark.sparkContext.parallelize(big, len(big)).map(walk).collect())
    out: list[Split] = []
    for seg in segments:
        cut = cuts.get(seg.log_partition)
        for split in ranges(seg, boundaries.get(seg.path, [0])):
            if (seg.path, split.start) in starts:
                split = Split(seg, split.start, split.end, starts[(seg.path, split.start)])
            if cut is None or cut[0] != seg.base_offset:
                out.append(split)
            elif split.start < cut[1]:
                out.append(Split(seg, split.start, min(split.end, cut[1]), split.expected))
    return out


def _decoder(tasks: list[list[Split]], columns: tuple[str, ...], latest_only: bool,
             damages: Accumulator[list[decode.Damage]], records: Accumulator[int],
             reads: Accumulator[list[decode.SplitRead]],
             ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        found: list[decode.Damage] = []
        read: list[decode.SplitRead] = []
        count = 0

        def task_rows() -> Iterator[decode.Row]:
            nonlocal count
            for batch in batches:
                for task in batch.column(0).to_pylist():
                    for split in tasks[task]:
                        for r in decode.rows(split, files_for(split.segment.path), found.append,
                                             on_read=read.append):
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
        reads.add(read)
        records.add(count)

    return run


def cut_note(read: LogRead, before: LogRead) -> str:
    """The progress line for ``read``, made again after ``before`` was: up to cuts, or skipping batches
    repeated at a split's start."""
    if read.cuts != before.cuts:
        where = ", ".join(f"partition {p} at byte {pos} of its segment {base}"
                          for p, (base, pos) in sorted(read.cuts.items()))
        return (f"kcoord's recovery cuts {where} (damage past the recovery point) and sets aside what follows: "
                "reading again up to there")
    where = ", ".join(f"{path} at byte {start}" for path, start in sorted(set(read.starts) - set(before.starts)))
    return f"batches repeated at the start of a split ({where}): reading again without them"


def report_damages(read: LogRead, err: TextIO) -> int:
    """Prints every damage found (file and byte position) and returns how many are corruption (torn
    tails, which kcoord's recovery cuts aside, are listed but not counted)."""
    corrupt = 0
    for d in read.damages():
        kind = "torn tail (cut there by kcoord's recovery, never acknowledged, ignored)" if d.torn_tail \
            else "CORRUPT"
        corrupt += not d.torn_tail
        print(f"kcoord pipeline: {kind}: {d.path} at byte {d.position}: {d.reason}", file=err)
    return corrupt
