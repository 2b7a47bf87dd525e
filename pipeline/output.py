"""Job outputs appear whole or not at all.

A job writes into ``<out>.kcoord-tmp-<id>`` next to ``<out>`` and renames it into place only when the
log read cleanly (or ``--skip-corrupt`` was given); otherwise the staging directory is deleted. Paths go
through Hadoop's FileSystem API on the driver, the same one Spark's writers use, so the outputs of
``snapshot`` and ``history`` may be local paths, HDFS or s3a URIs alike.
"""

import sys
import uuid
from typing import Any, Protocol, TextIO

from pyspark.sql import DataFrame, SparkSession

FORMATS = ("parquet", "csv")
# RFC 4180 CSV: Spark's defaults trim the spaces around values (group ids " " and "" became one) and
# escape a quote with a backslash, which other CSV readers take for a field's end (a fault campaign's
# find); multiLine reads back values holding line breaks as one row each.
CSV_OPTIONS = {"header": "true", "escape": '"', "ignoreLeadingWhiteSpace": "false",
               "ignoreTrailingWhiteSpace": "false", "multiLine": "true"}


class OutputError(Exception):
    """The output exists already or cannot be written."""


class StagedOutput:
    def __init__(self, spark: SparkSession, out: str) -> None:
        jvm: Any = spark._jvm
        conf = spark._jsc.hadoopConfiguration()
        self._jvm = jvm
        self.final = jvm.org.apache.hadoop.fs.Path(out)
        self._fs = self.final.getFileSystem(conf)
        if self._fs.exists(self.final):
            raise OutputError(f"{out} exists already: give a new path")
        self.staging_uri = f"{out.rstrip('/')}.kcoord-tmp-{uuid.uuid4().hex[:8]}"
        self.staging = jvm.org.apache.hadoop.fs.Path(self.staging_uri)

    def path(self, name: str) -> str:
        """Where ``<out>/<name>`` is staged (``name`` "" is ``<out>`` itself)."""
        return f"{self.staging_uri}/{name}" if name else self.staging_uri

    def write(self, df: DataFrame, name: str, fmt: str) -> None:
        """``df`` as ``<out>/<name>/`` (or ``<out>/``) in ``fmt`` (csv part files carry a header row)."""
        writer = df.write.mode("errorifexists")
        if fmt == "csv":
            writer.options(**CSV_OPTIONS).csv(self.path(name))
        else:
            writer.parquet(self.path(name))

    def count(self, spark: SparkSession, fmt: str, out: str) -> int:
        """Rows written to ``out`` (committed), read back as written."""
        return int(spark.read.format(fmt).options(**(CSV_OPTIONS if fmt == "csv" else {})).load(out).count())

    def write_bytes(self, name: str, data: bytes) -> None:
        stream = self._fs.create(self._jvm.org.apache.hadoop.fs.Path(self.path(name)), False)
        try:
            stream.write(bytearray(data))
        finally:
            stream.close()

    def commit(self) -> None:
        if not self._fs.exists(self.staging):
            self._fs.mkdirs(self.staging)
        if not self._fs.rename(self.staging, self.final):
            raise OutputError(f"could not rename {self.staging_uri} to {self.final.toString()}")

    def discard(self) -> None:
        self._fs.delete(self.staging, True)


class Staging(Protocol):
    def commit(self) -> None: ...

    def discard(self) -> None: ...


def settle(staging: Staging, corrupt: int, skip_corrupt: bool, err: TextIO) -> bool:
    """Puts the output in place, unless corruption was found without ``--skip-corrupt``: then it is
    discarded and the reason printed. True if the output was committed."""
    if corrupt and not skip_corrupt:
        staging.discard()
        say(f"{corrupt} corrupt batches or records: nothing written (--skip-corrupt writes what can be read)", err)
        return False
    staging.commit()
    return True


def skipped(corrupt: int) -> str:
    return f"; skipped {corrupt} corrupt batches or records" if corrupt else ""


def say(message: str, err: TextIO | None = None) -> None:
    """A progress line on stderr (stdout stays for results)."""
    print(f"kcoord pipeline: {message}", file=err or sys.stderr, flush=True)
