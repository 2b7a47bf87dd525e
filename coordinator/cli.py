"""``kcoord serve`` runs the coordinator; ``kcoord dump-log`` prints an offsets log as Kafka's offsets
formatter does (``[group,topic,partition]::OffsetAndMetadata[offset,metadata,commitTimestamp]``)."""

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from coordinator.config import Config, add_serve_arguments, config_from_args
from coordinator.runtime import ConfigMismatch, Runtime
from coordinator.server import Server
from protocol.records import (
    GroupMetadataRecord,
    OffsetCommitRecord,
    RecordError,
    UnknownRecord,
    decode_record,
)
from storage.log import Damage, list_segments, read_segment

log = logging.getLogger("kcoord")


def install_event_loop() -> str:
    """uvloop when importable (measured faster here), plain asyncio otherwise."""
    try:
        import uvloop
    except ImportError:
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"


async def serve(config: Config) -> None:
    server = Server(Runtime(config))
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("signal received: stopping (no new connections, finishing parked requests)")
    await server.stop()


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


def _segments(target: Path) -> Iterator[Path]:
    if target.is_dir():
        yield from (s.path for s in list_segments(target))
    else:
        yield target


def dump_log(target: Path, out: TextIO) -> int:
    """Prints every record of a segment or partition directory; returns the number of errors found."""
    errors = 0
    for path in _segments(target):
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kcoord", description="A standalone Kafka group coordinator.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve_parser = sub.add_parser("serve", help="run the coordinator")
    add_serve_arguments(serve_parser)
    dump = sub.add_parser("dump-log", help="print the records of an offsets log segment or partition directory")
    dump.add_argument("target", type=Path, help="a .log segment or a __consumer_offsets-N directory")
    args = parser.parse_args(argv)

    if args.command == "dump-log":
        if not args.target.exists():
            parser.error(f"{args.target} does not exist")
        return 1 if dump_log(args.target, sys.stdout) else 0

    config = config_from_args(args)
    logging.basicConfig(level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    loop_kind = install_event_loop()
    log.info("starting kcoord on %s", loop_kind)
    try:
        asyncio.run(serve(config))
    except ConfigMismatch as exc:
        log.error("%s", exc)
        return 2
    except OSError as exc:
        log.error("cannot start: %s", exc)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
