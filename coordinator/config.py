"""Server configuration: one dataclass, filled from command-line flags or ``KCOORD_*`` variables."""

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from protocol.framing import DEFAULT_MAX_FRAME_BYTES
from storage.log import DEFAULT_SEGMENT_BYTES

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
MAX_METADATA_LIMIT = 32767 // 3


@dataclass(frozen=True)
class Config:
    host: str = "127.0.0.1"
    port: int = 9092
    advertised_host: str | None = None  # None: same as the listener
    advertised_port: int | None = None
    data_dir: Path = Path("kcoord-data")
    offsets_partitions: int = 50
    node_id: int = 0
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    offset_metadata_max_bytes: int = 4096
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    delete_retention_ms: int = 24 * 3600 * 1000
    cleaner_interval_s: float = 15.0
    log_level: str = "INFO"

    @property
    def advertised(self) -> tuple[str, int]:
        """Where clients are told to find the coordinator (FindCoordinator, Metadata)."""
        return (self.advertised_host or self.host, self.advertised_port or self.port)


def parse_host_port(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) or an ``PLAINTEXT://HOST:PORT`` listener URL."""
    if "://" in value:
        value = value.split("://", 1)[1]
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    host = host.strip("[]")
    try:
        number = int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"port {port!r} is not a number") from None
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"port {number} is outside 0-65535")
    return host, number


def _bounded_int(low: int, high: int = 2**31 - 1) -> "argparse._ActionType":
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
        if not low <= number <= high:
            raise argparse.ArgumentTypeError(f"{number} is outside [{low}, {high}]")
        return number

    return parse


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Every flag defaults to its ``KCOORD_*`` environment variable, then to the built-in default."""

    def env(name: str, default: object) -> object:
        return os.environ.get(f"KCOORD_{name}", default)

    d = Config()
    parser.add_argument("--listen", type=parse_host_port, default=env("LISTEN", f"{d.host}:{d.port}"),
                        help="HOST:PORT to accept clients on (KCOORD_LISTEN, default %(default)s)")
    parser.add_argument("--advertised-listener", type=parse_host_port, default=env("ADVERTISED_LISTENER", None),
                        help="HOST:PORT clients are told to use (KCOORD_ADVERTISED_LISTENER, default: --listen)")
    parser.add_argument("--data-dir", type=Path, default=env("DATA_DIR", str(d.data_dir)),
                        help="directory of the __consumer_offsets-N logs (KCOORD_DATA_DIR, default %(default)s)")
    parser.add_argument("--offsets-partitions", type=_bounded_int(1, 100_000),
                        default=env("OFFSETS_PARTITIONS", d.offsets_partitions),
                        help="partitions of the offsets topic (KCOORD_OFFSETS_PARTITIONS, default %(default)s)")
    parser.add_argument("--node-id", type=_bounded_int(0), default=env("NODE_ID", d.node_id),
                        help="broker id reported to clients (KCOORD_NODE_ID, default %(default)s)")
    parser.add_argument("--segment-bytes", type=_bounded_int(1024), default=env("SEGMENT_BYTES", d.segment_bytes),
                        help="roll a log segment past this size (KCOORD_SEGMENT_BYTES, default %(default)s)")
    # Record strings carry an int16 length and UTF-8 takes at most 3 bytes per UTF-16 unit, so any
    # metadata accepted under this cap can be written to the log.
    parser.add_argument("--offset-metadata-max-bytes", type=_bounded_int(0, MAX_METADATA_LIMIT),
                        default=env("OFFSET_METADATA_MAX_BYTES", d.offset_metadata_max_bytes),
                        help="longest commit metadata accepted (KCOORD_OFFSET_METADATA_MAX_BYTES, default %(default)s)")
    parser.add_argument("--max-frame-bytes", type=_bounded_int(64), default=env("MAX_FRAME_BYTES", d.max_frame_bytes),
                        help="largest request accepted (KCOORD_MAX_FRAME_BYTES, default %(default)s)")
    parser.add_argument("--delete-retention-ms", type=_bounded_int(0, 2**63 - 1),
                        default=env("DELETE_RETENTION_MS", d.delete_retention_ms),
                        help="how long the cleaner keeps tombstones (KCOORD_DELETE_RETENTION_MS, default %(default)s)")
    parser.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default=env("LOG_LEVEL", d.log_level),
                        help="logging level (KCOORD_LOG_LEVEL, default %(default)s)")


def config_from_args(args: argparse.Namespace) -> Config:
    host, port = args.listen
    adv_host, adv_port = args.advertised_listener if args.advertised_listener else (None, None)
    return Config(
        host=host,
        port=port,
        advertised_host=adv_host,
        advertised_port=adv_port,
        data_dir=Path(args.data_dir),
        offsets_partitions=args.offsets_partitions,
        node_id=args.node_id,
        segment_bytes=args.segment_bytes,
        offset_metadata_max_bytes=args.offset_metadata_max_bytes,
        max_frame_bytes=args.max_frame_bytes,
        delete_retention_ms=args.delete_retention_ms,
        log_level=args.log_level,
    )
