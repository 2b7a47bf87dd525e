"""What the records mean, as DataFrame operations: which offset commits count, and the latest one per key.

Transactions (reference 8.3, 9.3): a record written in a transaction counts only once the next control
marker of its producer in the same log partition is a COMMIT; aborted and still open ones never count.
Among the records that count, the latest in the log wins (Kafka's rule: a committed transactional offset
replaces the current one only if its record is newer), and a tombstone deletes. That is compaction's
outcome and what OffsetFetch answers.
"""

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from pipeline.decode import CONTROL, OFFSET_COMMIT

KEY = ("group", "topic", "partition")
LOG_ORDER = ("log_partition", "log_offset")
TRANSACTION_COLUMNS = ("log_partition", "log_offset", "record_type", "producer_id", "transactional",
                       "control_type")


def with_counts(df: DataFrame, kinds: tuple[str, ...] = (OFFSET_COMMIT,)) -> DataFrame:
    """Every row, with ``counts``: true for the rows of ``kinds`` that count (the transactional ones
    only once committed). Needs the TRANSACTION_COLUMNS. The marker of a transactional row is the nearest
    control row after it for its producer: a window over (log partition, producer) in descending log
    order, whose growing frame Spark computes in one pass. Plain rows never need a marker, so each is its
    own window partition: nothing piles up in one task."""
    spread = F.when(F.col("transactional"), F.lit(-1)).otherwise(F.col("log_offset"))
    newer_first = (Window.partitionBy("log_partition", "producer_id", spread).orderBy(F.desc("log_offset"))
                   .rowsBetween(Window.unboundedPreceding, -1))
    marker = F.last("control_type", ignorenulls=True).over(newer_first)
    counts: Column = F.col("record_type").isin(*kinds) & (~F.col("transactional") | (marker == "COMMIT"))
    return df.withColumn("counts", counts)


def counted(df: DataFrame) -> DataFrame:
    """The offset-commit rows (tombstones included) that count."""
    commits_and_markers = df.filter(F.col("record_type").isin(OFFSET_COMMIT, CONTROL))
    return with_counts(commits_and_markers).filter(F.col("counts")).drop("counts")


def latest_offsets(commits: DataFrame, columns: tuple[str, ...]) -> DataFrame:
    """The latest counted commit per (group, topic, partition) with ``columns``, tombstoned ones removed."""
    newest = F.max_by(F.struct(*columns, "tombstone"), F.struct(*LOG_ORDER)).alias("r")
    return commits.groupBy(*KEY).agg(newest).select("r.*").filter(~F.col("tombstone")).drop("tombstone")
