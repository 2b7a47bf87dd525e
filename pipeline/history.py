"""``history``: how groups progressed, from every commit in the log.

- ``<out>/rates/``: per group, topic and minute of commit time: ``commits`` (offset-commit records, one
  per partition), ``offset_advance`` (how far the committed offsets moved in that minute, summed over the
  partitions; negative after a reset backwards) and ``advance_per_second``.
- ``<out>/stalled/``: the live partitions whose committed offset has not moved for at least
  ``--stalled-after`` before the newest commit in the log, re-committed or not: ``stalled_for_ms``,
  ``since`` (when the offset reached its value), ``last_commit`` and ``recommits`` since then.
- ``<out>/offset-advance.png``: the cumulative offset advance and its rate over time of the busiest groups.

Time is the commit timestamp the coordinator stamped; order is log order per partition. A tombstone ends
a partition's history: the next commit starts it again.
"""

import argparse
from typing import TextIO

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from pipeline.chart import bucket_ms, render
from pipeline.output import StagedOutput, say, settle, skipped
from pipeline.reader import cut_note, read_offsets_log, report_damages
from pipeline.semantics import KEY, LOG_ORDER, TRANSACTION_COLUMNS, counted

READ_COLUMNS = tuple(dict.fromkeys((*KEY, "offset", "commit_timestamp", "tombstone", *TRANSACTION_COLUMNS)))
MINUTE_MS = 60_000


def steps(commits: DataFrame) -> DataFrame:
    """Every counted commit with ``delta`` (its offset minus the previous one of its key, null after a
    tombstone or at the start), ``moved``, and ``run_start``/``run_rows`` (when the current offset value
    was first committed, and how many commits have repeated it since)."""
    by_key = Window.partitionBy(*KEY).orderBy(*LOG_ORDER)
    previous = F.lag("offset").over(by_key)
    rn = F.row_number().over(by_key)
    with_prev = commits.withColumn("_prev", previous).withColumn("_rn", rn)
    moved = F.col("_prev").isNull() | (F.col("offset") != F.col("_prev")) | F.col("tombstone")
    growing = by_key.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    return (with_prev.withColumn("moved", moved)
            .withColumn("delta", F.col("offset") - F.col("_prev"))
            .withColumn("run_start", F.last(F.when(F.col("moved"), F.col("commit_timestamp")), True).over(growing))
            .withColumn("run_rows", F.col("_rn") - F.last(F.when(F.col("moved"), F.col("_rn")), True).over(growing))
            .drop("_prev", "_rn"))


def rates(history: DataFrame) -> DataFrame:
    minute = (F.floor(F.col("commit_timestamp") / MINUTE_MS) * MINUTE_MS).cast("long")
    return (history.filter(~F.col("tombstone"))
            .groupBy("group", "topic", minute.alias("minute_ms"))
            .agg(F.count(F.lit(1)).alias("commits"), F.coalesce(F.sum("delta"), F.lit(0)).alias("offset_advance"),
                 F.countDistinct("partition").alias("partitions"))
            .withColumn("advance_per_second", F.col("offset_advance") / 60.0)
            .withColumn("minute", F.timestamp_millis("minute_ms"))
            .select("group", "topic", "minute", "minute_ms", "commits", "offset_advance", "advance_per_second",
                    "partitions")
            .orderBy("group", "topic", "minute_ms"))


def stalled(history: DataFrame, newest: int, after_ms: int) -> DataFrame:
    latest = F.max_by(F.struct("offset", "tombstone", "run_start", "run_rows", "commit_timestamp"),
                      F.struct(*LOG_ORDER)).alias("r")
    return (history.groupBy(*KEY).agg(latest)
            .filter(~F.col("r.tombstone"))
            .select(*KEY, "r.offset", (F.lit(newest) - F.col("r.run_start")).alias("stalled_for_ms"),
                    F.timestamp_millis("r.run_start").alias("since"),
                    F.timestamp_millis("r.commit_timestamp").alias("last_commit"),
                    F.col("r.run_rows").alias("recommits"))
            .filter(F.col("stalled_for_ms") >= after_ms)
            .orderBy(F.desc("stalled_for_ms"), *KEY))


def chart_data(history: DataFrame, top: int, bucket: int) -> list[tuple[str, int, int]]:
    """(group, bucket start ms, offset advance) for the ``top`` groups that advanced most."""
    advancing = history.filter(F.col("delta") > 0)
    busiest = [r["group"] for r in advancing.groupBy("group").agg(F.sum("delta").alias("a"))
               .orderBy(F.desc("a"), "group").limit(top).collect()]
    if not busiest:
        return []
    start = (F.floor(F.col("commit_timestamp") / bucket) * bucket).cast("long")
    rows = (advancing.filter(F.col("group").isin(busiest)).groupBy("group", start.alias("t"))
            .agg(F.sum("delta").alias("advance")).collect())
    return [(r["group"], int(r["t"]), int(r["advance"])) for r in rows]


def run(spark: SparkSession, args: argparse.Namespace, err: TextIO) -> int:
    read = read_offsets_log(spark, args.data_dir, READ_COLUMNS, args.split_bytes)
    say(f"history of {read.summary()}", err)
    out = StagedOutput(spark, args.out)
    history = steps(counted(read.df)).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        history.count()  # the whole log read, so that it is read again up to kcoord's cuts before anything is written
        while (again := read.cut_read()) is not None:
            history.unpersist()
            say(cut_note(again, read), err)
            read = again
            history = steps(counted(read.df)).persist(StorageLevel.MEMORY_AND_DISK)
            history.count()
        span = history.filter(~F.col("tombstone")).agg(F.min("commit_timestamp"), F.max("commit_timestamp")).first()
        oldest, newest = (int(span[0]), int(span[1])) if span is not None and span[0] is not None else (0, 0)
        out.write(rates(history), "rates", args.format)
        out.write(stalled(history, newest, args.stalled_after), "stalled", args.format)
        bucket = bucket_ms(newest - oldest)
        png = render(chart_data(history, args.top, bucket), bucket)
        out.write_bytes("offset-advance.png", png)
    except BaseException:  # Ctrl-C or a failed job: no staging directory left behind
        out.discard()
        raise
    finally:
        history.unpersist()
    corrupt = report_damages(read, err)
    if not settle(out, corrupt, args.skip_corrupt, err):
        return 1
    say(f"wrote rates/, stalled/ ({args.format}) and offset-advance.png to {args.out} from {read.records_read:,} "
        "records" + skipped(corrupt), err)
    if read.removed_by_compaction:
        say(f"the log was compacted ({read.removed_by_compaction:,} records removed): the history holds only the "
            "commits compaction kept, so rates/ counts fewer commits and stalled/ misses partitions re-committed "
            "at an unchanged offset whose earlier commits were removed", err)
    return 0
