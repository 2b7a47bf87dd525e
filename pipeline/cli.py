"""``kcoord pipeline JOB``: the Spark jobs from the command line (also ``python -m pipeline JOB`` and
``spark-submit pipeline/submit.py JOB``).

    kcoord pipeline snapshot --data-dir D --out O
    kcoord pipeline history  --data-dir D --out O --stalled-after 5m
    kcoord pipeline reshard  --data-dir D --out O --partitions 64

Common options: ``--master`` (default ``local[*]``), ``--format parquet|csv``, ``--skip-corrupt``,
``--ignore-journal``, ``--split-bytes N``, ``--conf KEY=VALUE``. Exit codes: 0 done, 1 corrupt batches
found (nothing written) or the job failed, 2 bad usage, an input a running kcoord serves or whose
journal holds batches, or the pipeline extra not installed, 130 interrupted (Ctrl-C). Nothing here
imports PySpark until a job runs, so ``kcoord`` without the extra still starts.
"""

import argparse
import importlib
import logging
import os
import re
import signal
import sys
import threading
from typing import Any, TextIO

from pipeline.layout import LayoutError, location

JOBS = {"snapshot": "pipeline.snapshot", "history": "pipeline.history", "reshard": "pipeline.reshard"}
DEFAULT_MASTER = "local[*]"
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def duration_ms(text: str) -> int:
    """``10s``, ``5m``, ``1.5h``, ``250ms``, ``2d`` as milliseconds."""
    m = _DURATION.match(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 10s, 5m, 2h or 250ms")
    return int(float(m.group(1)) * _UNIT_MS[m.group(2)])


def _conf(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def add_pipeline_parser(sub: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        "pipeline", help="Spark jobs over an offsets log: snapshot, history, reshard (needs the pipeline extra)")
    add_jobs(parser)
    return parser


def _location(given: str) -> str:
    """``location``, its refusal as argparse's usage error with the reason (a plain ValueError would
    only say the value is invalid)."""
    try:
        return location(given)
    except LayoutError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_jobs(parser: argparse.ArgumentParser) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", action="append", required=True, metavar="DIR", type=_location,
                        help="a kcoord data dir, a Kafka log dir or a __consumer_offsets-N dir (local, hdfs://, "
                             "s3a://; repeat for several)")
    common.add_argument("--out", required=True, type=_location, help="output path (it must not exist)")
    common.add_argument("--master", default=None, help=f"Spark master (default {DEFAULT_MASTER})")
    common.add_argument("--skip-corrupt", action="store_true",
                        help="write what can be read when batches are corrupt (they are still reported)")
    common.add_argument("--ignore-journal", action="store_true",
                        help="read the logs of a data directory whose journal holds batches a crash left, as they "
                             "are (refused otherwise: start and stop kcoord on it first)")
    common.add_argument("--split-bytes", type=_positive, default=None,
                        help="cut segments into ranges of about this size (default: a core's share, 4-128 MiB)")
    common.add_argument("--conf", type=_conf, action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting, e.g. spark.driver.memory=4g (repeatable)")
    tables = argparse.ArgumentParser(add_help=False)
    tables.add_argument("--format", choices=("parquet", "csv"), default="parquet",
                        help="output format (default parquet; csv part files carry a header row)")
    jobs = parser.add_subparsers(dest="job", required=True)
    jobs.add_parser("snapshot", parents=[common, tables],
                    help="the latest committed offset per group, topic and partition")
    history = jobs.add_parser("history", parents=[common, tables],
                              help="commit rates, stalled partitions and a chart of offset advance")
    history.add_argument("--stalled-after", type=duration_ms, default=duration_ms("5m"), metavar="DURATION",
                         help="report partitions whose offset has not moved this long (default 5m)")
    history.add_argument("--top", type=_positive, default=8, help="groups in the chart (default 8)")
    reshard = jobs.add_parser("reshard", parents=[common],
                              help="rewrite the log for another partition count, as a data dir kcoord serves")
    reshard.add_argument("--partitions", type=_positive, required=True, help="the new partition count")
    reshard.add_argument("--segment-bytes", type=_positive, default=100 * 1024 * 1024,
                         help="segment roll size of the new log (default 104857600)")


def run(args: argparse.Namespace, err: TextIO = sys.stderr, spark: Any = None,
        default_master: str | None = DEFAULT_MASTER) -> int:
    """Runs ``args.job`` in ``spark`` (or a session built from ``--master``, stopped afterwards)."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        print("kcoord pipeline: PySpark is not installed: pip install 'kcoord[pipeline]'", file=err)
        return 2
    from pipeline.layout import LayoutError
    from pipeline.output import OutputError
    from pipeline.session import build_session

    try:
        holds = _hold_inputs(args, err)
    except _Refused as exc:
        print(f"kcoord pipeline {args.job}: {exc}", file=err)
        return 2
    own = spark is None
    quiet = _QuietPy4j()
    try:
        if own:
            spark = build_session(args.master or default_master, f"kcoord-pipeline-{args.job}", conf=dict(args.conf))
            quiet.take_ctrl_c()
        job = importlib.import_module(JOBS[args.job])
        code: int = job.run(spark, args, err)
        return code
    except (LayoutError, OutputError) as exc:
        print(f"kcoord pipeline {args.job}: {exc}", file=err)
        return 2
    except BaseException as exc:
        # a Ctrl-C, also when it surfaced as a py4j error (a staging directory's discard, say, reaching
        # for the JVM that the same Ctrl-C at a terminal is taking down)
        if not (isinstance(exc, KeyboardInterrupt) or (quiet.interrupted and isinstance(exc, Exception))):
            raise
        quiet.interrupted = True
        print(f"kcoord pipeline {args.job}: {_interrupted(args.out)}", file=err)
        return 130
    finally:
        if own and spark is not None:
            quiet.stop(spark)
        for fd in holds:
            os.close(fd)


def _interrupted(out: str) -> str:
    """What an interrupted job left: its output appears whole or not at all (renamed into place once
    complete), so a local one that exists is complete."""
    from pipeline.layout import local_path

    local = local_path(out)
    if local is not None and local.exists():
        return f"interrupted after {out} was put in place (complete)"
    where = "was not put in place" if local is not None else "is complete if it exists"
    return f"interrupted; {out} {where} (a staging directory {out}.kcoord-tmp-* beside it may be left to delete)"


class _QuietPy4j(logging.Filter):
    """A Ctrl-C ends a job with one line, not ~100 of py4j tracebacks. PySpark's SIGINT handler calls
    into the JVM from inside the signal handler, re-entering the py4j call the job is blocked in (and at
    a terminal the JVM has the signal too and is going down); py4j then logs each failed call through
    the root logger. So: Ctrl-C only raises KeyboardInterrupt, py4j's root-logger lines about it are
    dropped, and once interrupted so are its complaints while the session stops."""

    def __init__(self) -> None:
        super().__init__()
        self.interrupted = False
        self._installed = False

    def take_ctrl_c(self) -> None:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._on_ctrl_c)
            logging.getLogger().addFilter(self)
            self._installed = True

    def _on_ctrl_c(self, signum: int, frame: Any) -> None:
        self.interrupted = True  # known even when what surfaces is a py4j error, not the KeyboardInterrupt
        logging.getLogger("py4j").setLevel(logging.CRITICAL + 1)  # its own loggers' complaints from now on
        raise KeyboardInterrupt

    def filter(self, record: logging.LogRecord) -> bool:
        if f"{os.sep}py4j{os.sep}" not in record.pathname:
            return True
        return not (self.interrupted or record.getMessage().startswith("KeyboardInterrupt"))

    def stop(self, spark: Any) -> None:
        try:
            if not self.interrupted:
                spark.stop()
                return
            logging.getLogger("py4j").setLevel(logging.CRITICAL + 1)  # a KeyboardInterrupt before take_ctrl_c
            if self._installed:  # a second Ctrl-C does not cut the stop short with a traceback
                signal.signal(signal.SIGINT, signal.SIG_IGN)
            try:  # cancelled first, the running tasks end quietly instead of failing as the context stops
                spark.sparkContext.cancelAllJobs()
                spark.stop()
            except Exception:  # the JVM went down with the Ctrl-C: nothing is left to stop
                pass
        finally:
            if self._installed:
                logging.getLogger().removeFilter(self)
                signal.signal(signal.SIGINT, signal.default_int_handler)


class _Refused(Exception):
    """An input the job must not read as it is."""


def _hold_inputs(args: argparse.Namespace, err: TextIO) -> list[int]:
    """Shared holds on the local data directories' locks for the job's length (a running kcoord rewrites
    and removes segments under a reader, and one cannot start meanwhile), and their journals checked: a
    journal that holds batches (a crash's, or a copy's of a running directory) means the logs may lack
    acknowledged commits and hold ones never acknowledged, which kcoord's next start resolves; the job
    reads them as they are only with ``--ignore-journal``. A ``file:///`` URI is a local directory like
    any other; other URIs are read as given."""
    from pipeline.layout import data_dir_of, local_path
    from storage.dirlock import DirectoryInUse, share_directory
    from storage.journal import left_over_note

    holds: list[int] = []
    try:
        for given in getattr(args, "data_dir", None) or []:
            local = local_path(given, decoded=True)  # the directory pyarrow reads, not a name with %20 in it
            if local is None:
                continue
            data_dir = data_dir_of(local)
            try:
                fd = share_directory(data_dir)
            except DirectoryInUse as exc:
                raise _Refused(f"{exc}: stop it first, or read a copy made while it was stopped") from None
            except OSError as exc:
                raise _Refused(f"cannot open {data_dir}'s lock: {exc}") from None
            if fd is not None:
                holds.append(fd)
            note = left_over_note(data_dir)
            if note and not args.ignore_journal:
                raise _Refused(f"{note}. Start kcoord on {data_dir} once and stop it (it writes them in and sets "
                               f"aside what was never acknowledged), or pass --ignore-journal to read the logs as "
                               f"they are")
            if note:
                print(f"kcoord pipeline {args.job}: {note}", file=err)
    except BaseException:
        for fd in holds:
            os.close(fd)
        raise
    return holds


def main(argv: list[str] | None = None, default_master: str | None = DEFAULT_MASTER) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline", description=__doc__.split("\n\n")[0])
    add_jobs(parser)
    return run(parser.parse_args(argv), default_master=default_master)
