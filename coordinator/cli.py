"""``kcoord serve`` runs the coordinator; ``kcoord dump-log`` prints an offsets log as Kafka's offsets
formatter does (``[group,topic,partition]::OffsetAndMetadata[offset,metadata,commitTimestamp]``);
``kcoord groups`` administers consumer groups over the wire (coordinator/groups_cli.py); ``kcoord pipeline``
runs the Spark jobs over an offsets log (pipeline/cli.py)."""

import argparse
import asyncio
import contextlib
import gc
import importlib
import logging
import os
import resource
import signal
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TextIO

import coordinator
from coordinator import startup  # first: kafka-python's and aiokafka's clients stay unimported
from coordinator.cluster import shared_listener
from coordinator.config import Config, ConfigError, add_serve_arguments, config_from_args
from coordinator.exporter import Exporter
from coordinator.logfmt import configure_logging
from coordinator.runtime import OFFSETS_TOPIC, ConfigMismatch, Runtime
from coordinator.server import Server
from protocol import compiled
from protocol.records import (
    GroupMetadataRecord,
    OffsetCommitRecord,
    RecordError,
    UnknownRecord,
    decode_record,
    prepare_schemas,
)
from storage.journal import left_over_note
from storage.segments import Damage, list_segments, read_segment

startup.imports_done()
log = logging.getLogger("kcoord")


def install_event_loop() -> str:
    """uvloop when importable (measured faster here), plain asyncio otherwise."""
    try:
        import uvloop
    except ImportError:
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"


EXIT_ABANDONED = -1  # serve() stopped at its deadline with work abandoned
SWITCH_INTERVAL_S = 0.0002  # GIL hand-off: how long the event loop may wait on a busy worker thread
# Young collections every 25,000 net allocations instead of CPython's 700, full ones 100x rarer.
GC_THRESHOLDS = (25_000, 10, 1000)


def tune_interpreter() -> None:
    """The event loop shares the GIL with writer threads and the bulk thread that decodes huge requests.
    Two interpreter settings decide how long it can be kept waiting (measured with a bystander client
    during a 3 MB, 150k-partition commit, tests/integration/test_stalls.py: 250-380 ms worst round trips
    with the defaults, ~70 ms with these):
    - the switch interval (default 5 ms) bounds each wait for the GIL, and a request needs several.
      The writer thread waits too, after every sync it makes with the GIL released (it used to append
      too: with 1 ms, a flush cycle over 10 busy partitions took ~15 ms, 13 of them in its ten
      2-record appends, while 20 clients flooded the loop; 0.2 ms brought that to ~5 ms, and a commit
      sharing a partition with a flooding client to a p99 of ~35 ms instead of 114-122,
      test_flow_control.py; the appends have since moved to the loop, coordinator/flusher.py);
    - a full cyclic-GC pass holds the GIL while it scans every tracked object, and such a request
      creates about a million. Full passes are made rare.
    The young generation's threshold is for the request path: 64 pipelined 100-partition commits hold
    ~25-40k tracked objects in flight (their tuples and lists), and CPython counts *net* allocations, so
    a threshold below that makes each swing of the working set start a collection that finds nearly
    all of it alive, scans it, promotes it (a middle collection then scans it again) just before it
    dies. At CPython's 700 a collection ran nearly every request: 235 ms of collections per 3,000 such
    commits in ``bench.request_path`` (~16% of their CPU). Against a kcoord under the harness's
    commit-100 (~6 s): at 10,000, 101 young collections, 266 ms in all (up to 5.7 ms each); at
    25,000, 3 and 5 ms; at 50,000, 2 and 0.2 ms. Cachegrind put 25,000 and 50,000 level: ~8% fewer
    instructions per 100-partition commit than 10,000, and the same for 1-partition requests.
    The price is the pause when young objects do survive, which grows with the threshold: while the
    state grows (a fleet's members joining 1,000 groups, 64 connections committing to 12,800 new
    groups) the longest young collection was 7.8-14 ms at 10,000, 15-17 ms at 25,000 and 22-55 ms at
    50,000 (in total 53-950 ms, 39-130 ms and 38-78 ms). 25,000 keeps the commit path's gain and the
    growth pauses near 10,000's."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    gc.set_threshold(*GC_THRESHOLDS)
    # Every connection is a file descriptor; running out makes log writes fail. Use what is allowed.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))
        except (ValueError, OSError):
            pass


async def _when_loaded(runtime: Runtime) -> None:
    """Once every partition is loaded, the cache built so far is long-lived: freezing it keeps later
    collections from scanning it again (it is still freed normally when entries are replaced). Then the
    record schemas' codecs for group metadata (protocol.records) are built on a thread, if no loaded
    record needed them, so that the first rebalance does not wait for them on the loop."""
    await runtime.wait_loaded()
    gc.collect()
    gc.freeze()
    await asyncio.get_running_loop().run_in_executor(None, prepare_schemas)


def warn_stale_builds() -> list[str]:
    """A compiled module built from other sources than those beside it (an editable install edited since
    ``pip install -e .``):
    the loader and the registry then leave a stale codec unused, but every other compiled module still
    runs, as Python imports the compiled module before the source beside it. Says so loudly; returns
    the names."""
    found = [name for name in compiled.MODULES if compiled.stale(importlib.import_module(name))]
    for name in found:
        log.warning("%s: the compiled module was built from an older version of its sources; re-run pip install -e .",
                    name)
    return found


def _check_builds() -> None:
    """``warn_stale_builds`` on a thread once the server listens: reading and scanning the compiled
    modules' sources took ~40M instructions (~14 ms) before it could, and the check only warns. Not
    later than that: a stale loader is the likeliest reason a load is slow, which is when to say so."""
    try:
        warn_stale_builds()
    except Exception:  # a warning's own failure must not stop the server
        log.exception("could not check whether the compiled modules are up to date")


async def _unless_stopped(work: Coroutine[Any, Any, None], stop: asyncio.Event) -> None:
    """Runs ``work`` until it ends or ``stop`` is set (then cancelled)."""
    task = asyncio.ensure_future(work)
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait((task, stopping), return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    elif (failed := task.exception()) is not None:
        raise failed


async def serve(config: Config, event_loop: str = "asyncio") -> int:
    tune_interpreter()
    runtime = Runtime(config)
    server = Server(runtime)
    exporter = Exporter(runtime, server, _version(), event_loop)
    if config.metrics_listen is not None:
        host, port = exporter.bind(*config.metrics_listen)  # before anything is created on disk
    gateway = None
    if config.upstream:
        from coordinator.gateway.metrics import GatewayMetrics
        from coordinator.gateway.relay import Gateway

        gateway = Gateway(server, config, GatewayMetrics())
        exporter.registry.register(gateway.metrics)
        server.gateway = gateway
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # SIGHUP: the JVM's shutdown too, as Kafka's
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    exporter.start()
    if config.metrics_listen is not None:
        log.info("metrics on http://%s:%d/metrics (health: /healthz, /readyz)", host, port)
    loop.run_in_executor(None, _check_builds)
    after_load = loop.create_task(_when_loaded(runtime))
    if gateway is not None:
        # Up to 10 s while the upstream does not answer: health checks and a stop are served meanwhile.
        await _unless_stopped(gateway.start(), stop)
    await stop.wait()
    log.info("signal received: stopping (no new requests; pending writes get %d ms to finish)",
             config.shutdown_timeout_ms)
    after_load.cancel()
    if gateway is not None:
        gateway.stop()
    clean = await server.stop(config.shutdown_timeout_ms / 1000.0)
    exporter.stop()
    return 0 if clean else EXIT_ABANDONED


def format_record(record: OffsetCommitRecord | GroupMetadataRecord | UnknownRecord) -> str:
    if isinstance(record, OffsetCommitRecord):
        k, v = record
        head = f"[{k.group},{k.topic},{k.partition}]"
        if v is None:
            return f"{head}::NULL"
        return f"{head}::OffsetAndMetadata[{v.offset},{v.metadata or 'NO_METADATA'},{v.commit_timestamp}]"
    if isinstance(record, GroupMetadataRecord):
        g = record.value
        if g is None:
            return f"{record.group}::NULL"
        members = ",".join(m.member_id for m in g.members)
        return (f"{record.group}::GroupMetadata[{g.protocol_type},{g.generation},{g.protocol},{g.leader},"
                f"members=[{members}]]")
    return f"<record type {record.record_type}>"


def _is_partition_dir(path: Path) -> bool:
    return path.is_dir() and path.name.startswith(OFFSETS_TOPIC + "-") and path.name.rsplit("-", 1)[1].isdigit()


def _partition_dirs(target: Path) -> list[Path]:
    """A data directory's partition directories, in partition order (empty for anything else)."""
    dirs = [p for p in target.iterdir() if _is_partition_dir(p)]
    return sorted(dirs, key=lambda p: int(p.name.rsplit("-", 1)[1]))


def dump_log(target: Path, out: TextIO) -> int:
    """Prints every record of a segment, a partition directory, or every partition of a data
    directory (each under a ``# __consumer_offsets-N`` line); returns the number of errors found."""
    if target.is_dir() and not list_segments(target) and not _is_partition_dir(target):
        partitions = _partition_dirs(target)
        if not partitions:
            raise FileNotFoundError(f"{target} holds no log segments and no {OFFSETS_TOPIC}-N directories")
        errors = 0
        for directory in partitions:
            print(f"# {directory.name}", file=out)
            errors += dump_log(directory, out)
        return errors
    errors = 0
    segments = [s.path for s in list_segments(target)] if target.is_dir() else [target]
    for path in segments:
        for item in read_segment(path):
            if isinstance(item, Damage):
                kind = "torn tail" if item.torn else "CORRUPT"
                print(f"ERROR {kind}: {path} at byte {item.position}: {item.reason}", file=out)
                errors += 1
                break
            if item.control_type is not None:
                marker = "COMMIT" if item.control_type == 1 else "ABORT"
                print(f"<{marker} marker, producer {item.producer_id}>", file=out)
                continue
            for rec in item.records:
                try:
                    print(format_record(decode_record(rec.key, rec.value)), file=out)
                except RecordError as exc:
                    print(f"ERROR: {path} record at offset {rec.offset}: {exc}", file=out)
                    errors += 1
    return errors


def _note_journal(target: Path) -> None:
    """Says on stderr when the data directory's journal holds batches: the logs read here may lag them
    (by up to a checkpoint while kcoord runs; after a machine crash, until kcoord starts again and
    writes them into the logs)."""
    data_dir = target if not target.is_file() else target.parent
    if _is_partition_dir(data_dir):
        data_dir = data_dir.parent
    note = left_over_note(data_dir, "these logs")
    if note:
        print(f"kcoord dump-log: {note}", file=sys.stderr)


def _version() -> str:
    return coordinator.__version__


def _dump(parser: argparse.ArgumentParser, target: Path) -> int:
    if not target.exists():
        parser.error(f"{target} does not exist")
    _note_journal(target)
    try:
        return _until_reader_leaves(lambda: 1 if dump_log(target, sys.stdout) else 0)
    except FileNotFoundError as exc:
        parser.error(str(exc))
    return 0


def _until_reader_leaves(work: Callable[[], int]) -> int:
    """``work()``, stopped quietly if the reader of its output goes away (``| head``); stdout is then
    redirected so the interpreter's final flush does not raise again."""
    try:
        code = work()
        sys.stdout.flush()  # the last buffered output too, or the interpreter's own flush at exit raises
        return code
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _add_pipeline_parser(sub: Any) -> None:
    """``kcoord pipeline``: the Spark jobs (pipeline/). Imported here only, and PySpark only when a job
    runs, so the service neither depends on the pipeline nor needs its extra installed (an install
    without the package at all just has no ``pipeline`` command)."""
    try:
        from pipeline.cli import add_pipeline_parser
    except ImportError:
        return

    add_pipeline_parser(sub)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="kcoord", description="A standalone Kafka group coordinator.")
    parser.add_argument("--version", action="version", version=f"kcoord {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve_parser = sub.add_parser("serve", help="run the coordinator")
    add_serve_arguments(serve_parser)
    dump = sub.add_parser("dump-log", help="print the records of an offsets log (segment, partition or data dir)")
    dump.add_argument("target", type=Path, help="a .log segment, a __consumer_offsets-N directory or a data directory")
    if argv[:1] != ["serve"]:
        # The admin and pipeline commands' modules (~20 ms of imports: wcwidth, the admin client's
        # helpers) are not loaded to serve: a restart answers that much sooner.
        from coordinator.groups_cli import add_groups_parser

        add_groups_parser(sub)
        _add_pipeline_parser(sub)
    args = parser.parse_args(argv)

    if args.command == "dump-log":
        return _dump(dump, args.target)
    if args.command == "groups":
        from coordinator.groups_cli import run as run_groups

        return _until_reader_leaves(lambda: run_groups(args))
    if args.command == "pipeline":
        from pipeline.cli import run as run_pipeline

        return run_pipeline(args)

    try:
        config = config_from_args(args)
    except ConfigError as exc:
        serve_parser.error(str(exc))
    if config.processes > 1:
        from coordinator.supervisor import Supervisor

        configure_logging(config.log_level, config.log_format)
        log.info("starting kcoord %s as %d processes", _version(), config.processes)
        return Supervisor(config, run_server).run()
    return run_server(config)


def run_server(config: Config) -> int:
    """Runs one server until stopped (a node of ``--processes`` in its own process); its exit status. A
    cluster node's log lines say which node wrote them (the nodes of ``--processes`` share one output)."""
    configure_logging(config.log_level, config.log_format, config.node_id if config.cluster else None)
    if config.cluster:
        refusal, notes = shared_listener(config.cluster)
        for note in notes:
            log.warning("%s", note)
        if refusal is not None:
            log.error("%s", refusal)
            return 2
    loop_kind = install_event_loop()
    log.info("starting kcoord %s on %s (pid %d)", _version(), loop_kind, os.getpid())
    try:
        code = asyncio.run(serve(config, loop_kind))
    except ConfigMismatch as exc:
        log.error("%s", exc)
        return 2
    except OSError as exc:
        log.error("cannot start: %s", exc)
        return 2
    if code == EXIT_ABANDONED:
        # The deadline passed with work abandoned (a write stuck in fsync, say): exit now rather than
        # wait for that thread at interpreter exit. Nothing abandoned was acknowledged. Not 0: a
        # supervisor can tell this stop from a clean one (Kafka halts with 1 when its shutdown fails).
        logging.shutdown()
        os._exit(1)
    return code


if __name__ == "__main__":
    sys.exit(main())
