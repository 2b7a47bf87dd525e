"""Server configuration: one dataclass, filled from command-line flags or ``KCOORD_*`` variables.

Every option is declared once in ``OPTIONS`` (flag, variable, parser, help); a flag beats its variable,
which beats the built-in default. A bad value is reported under the name the operator used: the flag,
or the variable (``KCOORD_LOG_LEVEL='bogus': ...``), never a traceback.
"""

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coordinator.cluster import Node, canonical_address, owner_index
from protocol.framing import DEFAULT_MAX_FRAME_BYTES

if TYPE_CHECKING:
    from coordinator.groups.messages import GroupConfig

# storage.log's own default, kept equal by a test: importing storage.log (or the group messages) here
# loaded the record codecs and kafka-python's classes, ~0.5 s and ~20 MB for every reader of the
# settings (the container's HEALTHCHECK reads them every 15 s)
DEFAULT_SEGMENT_BYTES = 100 * 1024 * 1024

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS = ("text", "json")
SYNC_MODES = ("journal", "syncfs", "fsync")
OFF = ("off", "none", "disabled")
MAX_METADATA_LIMIT = 32767 // 3
# Below this no stock client gets through its handshake and a modest commit (an ApiVersions v3 from
# librdkafka alone carries its software name and version; Metadata answers are larger still).
MIN_FRAME_BYTES = 8192
INT31 = 2**31 - 1
INT63 = 2**63 - 1


class ConfigError(Exception):
    """A setting that cannot be used, with the flag or variable it came from."""


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
    max_buffered_bytes: int = 2 * DEFAULT_MAX_FRAME_BYTES
    max_connections: int | None = None  # None: only the open-files limit caps them (coordinator.admission)
    delete_retention_ms: int = 24 * 3600 * 1000
    shutdown_timeout_ms: int = 10_000
    group_initial_rebalance_delay_ms: int = 3000
    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1_800_000
    group_max_size: int = INT31
    offsets_retention_minutes: int = 10080
    offsets_retention_check_interval_ms: int = 600_000
    log_cleaner_backoff_ms: int = 15_000
    log_level: str = "INFO"
    log_format: str = "text"
    sync_mode: str = "journal"
    checkpoint_interval_ms: int = 250
    sync_helper: bool = True  # flush cycles' fsync/syncfs made by a helper process (storage.synchelper)
    metrics_listen: tuple[str, int] | None = ("127.0.0.1", 9404)  # None: no metrics listener
    upstream: tuple[tuple[str, int], ...] = ()  # gateway mode when set: the upstream cluster's bootstrap
    broker_port_base: int | None = None  # gateway: node N listens on base + N (None: any free port)
    broker_host: str | None = None  # gateway: host advertised for the node listeners (None: advertised host)
    coordinator_node_id: int = 1_000_000_000  # gateway: kcoord's group coordinator, a node of its own
    coordinator_port: int = 0  # gateway: its listener's port (0: any free port)
    upstream_timeout_ms: int = 30_000
    upstream_refresh_ms: int = 10_000
    cluster: tuple[Node, ...] = ()  # cluster mode (coordinator.cluster): every node, ascending ids; () standalone
    processes: int = 1  # > 1: a cluster of that many nodes on this host (coordinator.supervisor)

    def groups(self) -> "GroupConfig":
        from coordinator.groups.messages import GroupConfig

        return GroupConfig(
            initial_rebalance_delay_ms=self.group_initial_rebalance_delay_ms,
            min_session_timeout_ms=self.group_min_session_timeout_ms,
            max_session_timeout_ms=self.group_max_session_timeout_ms,
            max_size=self.group_max_size,
            offsets_retention_ms=self.offsets_retention_minutes * 60_000,
            offsets_retention_check_interval_ms=self.offsets_retention_check_interval_ms,
        )

    @property
    def advertised(self) -> tuple[str, int]:
        """Where clients are told to find the coordinator (FindCoordinator, Metadata). With ``--listen
        HOST:0`` the server sets ``advertised_port`` to the port it was given once bound."""
        return (self.advertised_host or self.host, self.advertised_port or self.port)

    @property
    def nodes(self) -> tuple[Node, ...]:
        """Every broker clients are told of: the cluster's nodes, or this one alone."""
        return self.cluster or (Node(self.node_id, *self.advertised),)

    def owner(self, partition: int) -> Node:
        """The node coordinating the groups of offsets partition ``partition``."""
        nodes = self.nodes
        return nodes[owner_index(partition, len(nodes))]

    def leaders(self) -> list[int]:
        """Each offsets partition's leader, as Metadata tells it: the node coordinating its groups."""
        return [self.owner(p).node_id for p in range(self.offsets_partitions)]

    def owns(self, partition: int) -> bool:
        return not self.cluster or self.owner(partition).node_id == self.node_id


def parse_host_port(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) or an ``PLAINTEXT://HOST:PORT`` listener URL."""
    if "://" in value:
        value = value.split("://", 1)[1]
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    if host.startswith("[") and host.endswith("]") and len(host) > 2:
        host = host[1:-1]
    if "[" in host or "]" in host:
        raise ValueError(f"expected HOST:PORT or [IPv6]:PORT, got {value!r}")
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"port {port!r} is not a number") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"port {number} is outside 0-65535")
    return host, number


def is_wildcard(host: str) -> bool:
    """Whether ``host`` is an unspecified address (every interface, none a client can connect to):
    ``0.0.0.0``, ``::`` and their other spellings (``::0``, ``0:0:0:0:0:0:0:0``, ``::ffff:0.0.0.0``),
    which bind alike."""
    try:
        return canonical_address(host).is_unspecified
    except ValueError:
        return False


def reachable_host_port(value: str) -> tuple[str, int]:
    """``parse_host_port`` for an address clients are given: port 0 and a wildcard host are where no
    client can connect."""
    host, port = parse_host_port(value)
    if not host.strip() or any(c.isspace() for c in host):
        raise ValueError(f"host {host!r} has spaces: no client can resolve it")
    if port == 0:
        raise ValueError("port 0 cannot be advertised (give the port clients connect to)")
    if is_wildcard(host):
        raise ValueError(f"{host} cannot be advertised: it means every interface, not one "
                         "clients can connect to (give a host name or address they reach kcoord at)")
    return host, port


def parse_cluster(value: str) -> tuple[Node, ...]:
    """``ID@HOST:PORT[,ID@HOST:PORT...]``, every node's advertised listener, sorted by id; empty (or
    ``none``, ``off``) for one node, so that ``--cluster ''`` undoes a ``KCOORD_CLUSTER`` the environment
    sets (an empty variable is an unset one, but a flag given is always read)."""
    if value.strip().lower() in ("", *OFF):
        return ()
    nodes: list[Node] = []
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        node_id, sep, address = (side.strip() for side in item.partition("@"))
        if not sep:
            raise ValueError(f"expected ID@HOST:PORT, got {item!r}")
        try:
            number = int(node_id)
        except ValueError:
            raise ValueError(f"node id {node_id!r} in {item!r} is not an integer") from None
        if not 0 <= number <= INT31:
            raise ValueError(f"node id {number} is outside 0-{INT31}")
        nodes.append(Node(number, *reachable_host_port(address)))
    if not nodes:
        raise ValueError("no node given")
    if len({n.node_id for n in nodes}) != len(nodes):
        raise ValueError(f"a node id is given twice: {sorted(n.node_id for n in nodes)}")
    if len({(n.host, n.port) for n in nodes}) != len(nodes):
        raise ValueError("two nodes are given the same HOST:PORT")
    return tuple(sorted(nodes))


def bounded_int(low: int, high: int = INT31) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise ValueError(f"{value!r} is not an integer") from None
        if not low <= number <= high:
            raise ValueError(f"{number} is outside [{low}, {high}]")
        return number

    return parse


def log_level(value: str) -> str:
    level = value.strip().upper()
    if level not in LOG_LEVELS:
        raise ValueError(f"{value!r} is not one of {', '.join(LOG_LEVELS)}")
    return level


def log_format(value: str) -> str:
    fmt = value.strip().lower()
    if fmt not in LOG_FORMATS:
        raise ValueError(f"{value!r} is not one of {', '.join(LOG_FORMATS)}")
    return fmt


def sync_mode(value: str) -> str:
    mode = value.strip().lower()
    if mode not in SYNC_MODES:
        raise ValueError(f"{value!r} is not one of {', '.join(SYNC_MODES)}")
    return mode


def on_off(value: str) -> bool:
    word = value.strip().lower()
    if word not in ("on", "off"):
        raise ValueError(f"{value!r} is not on or off")
    return word == "on"


def host_port_list(value: str) -> tuple[tuple[str, int], ...]:
    addresses = tuple(parse_host_port(part.strip()) for part in value.split(",") if part.strip())
    if not addresses:
        raise ValueError("expected HOST:PORT[,HOST:PORT...]")
    return addresses


def optional_host_port(value: str) -> tuple[str, int] | None:
    return None if value.strip().lower() in OFF else parse_host_port(value)


@dataclass(frozen=True)
class Option:
    flag: str
    env: str
    parse: Callable[[str], Any]
    apply: Callable[[Any], dict[str, Any]]  # parsed value -> Config fields
    help: str
    metavar: str = "N"


def _field(name: str) -> Callable[[Any], dict[str, Any]]:
    return lambda value: {name: value}


OPTIONS: list[Option] = [
    Option("--listen", "KCOORD_LISTEN", parse_host_port,
           lambda hp: {"host": hp[0], "port": hp[1]}, "HOST:PORT to accept clients on (default 127.0.0.1:9092)",
           "HOST:PORT"),
    Option("--advertised-listener", "KCOORD_ADVERTISED_LISTENER", reachable_host_port,
           lambda hp: {"advertised_host": hp[0], "advertised_port": hp[1]},
           "HOST:PORT clients are told to use (default: the listener)", "HOST:PORT"),
    Option("--data-dir", "KCOORD_DATA_DIR", Path, _field("data_dir"),
           "directory of the __consumer_offsets-N logs (default ./kcoord-data)", "DIR"),
    Option("--offsets-partitions", "KCOORD_OFFSETS_PARTITIONS", bounded_int(1, 100_000),
           _field("offsets_partitions"), "partitions of the offsets topic, fixed once data exists (default 50)"),
    Option("--node-id", "KCOORD_NODE_ID", bounded_int(0), _field("node_id"),
           "broker id reported to clients (default 0)"),
    Option("--cluster", "KCOORD_CLUSTER", parse_cluster, _field("cluster"),
           "cluster mode: ID@HOST:PORT[,...] of every kcoord node's advertised listener, this one's included "
           "(--node-id picks it); each node coordinates the groups of the offsets partitions p with p mod N = its "
           "index in ascending id order, and answers NOT_COORDINATOR for the others'; '' or none: one node, whatever "
           "KCOORD_CLUSTER says (default: none, one node)",
           "ID@HOST:PORT,..."),
    Option("--processes", "KCOORD_PROCESSES", bounded_int(1, 1024), _field("processes"),
           "cluster mode on this host: run N nodes (one per core), node i listening on the --listen port + i, "
           "its data in DATA_DIR/node-i and its metrics on the metrics port + i (default 1: one process)"),
    Option("--segment-bytes", "KCOORD_SEGMENT_BYTES", bounded_int(1024), _field("segment_bytes"),
           "roll a log segment past this size (default 104857600)"),
    # Record strings carry an int16 length and UTF-8 takes at most 3 bytes per UTF-16 unit, so any
    # metadata accepted under this cap can be written to the log.
    Option("--offset-metadata-max-bytes", "KCOORD_OFFSET_METADATA_MAX_BYTES", bounded_int(0, MAX_METADATA_LIMIT),
           _field("offset_metadata_max_bytes"), "longest commit metadata accepted, in UTF-16 units (default 4096)"),
    Option("--max-frame-bytes", "KCOORD_MAX_FRAME_BYTES", bounded_int(MIN_FRAME_BYTES),
           _field("max_frame_bytes"), "largest request accepted (default 104857600)"),
    Option("--max-buffered-bytes", "KCOORD_MAX_BUFFERED_BYTES", bounded_int(MIN_FRAME_BYTES, INT63),
           _field("max_buffered_bytes"),
           "request bytes buffered across all connections before reading pauses (default 209715200)"),
    Option("--max-connections", "KCOORD_MAX_CONNECTIONS", bounded_int(1, INT31), _field("max_connections"),
           "most client connections open at once; more are closed as they arrive (default: as many as the "
           "open-files limit allows, less what the logs keep)"),
    Option("--delete-retention-ms", "KCOORD_DELETE_RETENTION_MS", bounded_int(0, INT63),
           _field("delete_retention_ms"), "how long the cleaner keeps tombstones (default 86400000)"),
    Option("--log-cleaner-backoff-ms", "KCOORD_LOG_CLEANER_BACKOFF_MS", bounded_int(1, INT63),
           _field("log_cleaner_backoff_ms"), "how long the cleaner waits between looks at every partition's log "
           "(Kafka's log.cleaner.backoff.ms; sooner after a full disk has room again) (default 15000)"),
    Option("--shutdown-timeout-ms", "KCOORD_SHUTDOWN_TIMEOUT_MS", bounded_int(0, 3_600_000),
           _field("shutdown_timeout_ms"), "longest a stop may take to finish pending writes (default 10000)"),
    Option("--group-initial-rebalance-delay-ms", "KCOORD_GROUP_INITIAL_REBALANCE_DELAY_MS", bounded_int(0),
           _field("group_initial_rebalance_delay_ms"), "how long a new group waits for more members (default 3000)"),
    Option("--group-min-session-timeout-ms", "KCOORD_GROUP_MIN_SESSION_TIMEOUT_MS", bounded_int(0),
           _field("group_min_session_timeout_ms"), "shortest session timeout a member may ask for (default 6000)"),
    Option("--group-max-session-timeout-ms", "KCOORD_GROUP_MAX_SESSION_TIMEOUT_MS", bounded_int(0),
           _field("group_max_session_timeout_ms"), "longest session timeout a member may ask for (default 1800000)"),
    Option("--group-max-size", "KCOORD_GROUP_MAX_SIZE", bounded_int(1), _field("group_max_size"),
           "most members a group may have (default 2147483647: unbounded)"),
    Option("--offsets-retention-minutes", "KCOORD_OFFSETS_RETENTION_MINUTES", bounded_int(1),
           _field("offsets_retention_minutes"), "how long offsets of an idle group are kept (default 10080)"),
    Option("--offsets-retention-check-interval-ms", "KCOORD_OFFSETS_RETENTION_CHECK_INTERVAL_MS", bounded_int(1),
           _field("offsets_retention_check_interval_ms"), "how often expired offsets are removed (default 600000)"),
    Option("--sync-mode", "KCOORD_SYNC_MODE", sync_mode, _field("sync_mode"),
           "journal: a commit is durable once one write-ahead journal file is fdatasynced, the partition logs "
           "are synced behind it once per --checkpoint-interval-ms (Linux 5.8+, else syncfs); syncfs: make the "
           "pending batches of many partitions durable with one syncfs of their file system (Linux 5.8+; "
           "elsewhere per file); or fsync: always one fsync per partition log (default journal)",
           "MODE"),
    Option("--checkpoint-interval-ms", "KCOORD_CHECKPOINT_INTERVAL_MS", bounded_int(10),
           _field("checkpoint_interval_ms"), "journal mode: how often the partition logs are synced and the "
           "journal cut back behind them (default 250)"),
    Option("--sync-helper", "KCOORD_SYNC_HELPER", on_off, _field("sync_helper"),
           "on: a helper process makes each flush cycle's fsync or syncfs, so the event loop never waits for "
           "the GIL a writer thread holds; off: the writer thread makes every sync (default on)", "on|off"),
    Option("--metrics-listen", "KCOORD_METRICS_LISTEN", optional_host_port, _field("metrics_listen"),
           "HOST:PORT of the HTTP listener for /metrics, /healthz and /readyz, or 'off' (default 127.0.0.1:9404)",
           "HOST:PORT"),
    Option("--upstream", "KCOORD_UPSTREAM", host_port_list, _field("upstream"),
           "gateway mode: HOST:PORT[,HOST:PORT...] of an upstream Kafka-compatible cluster whose data path kcoord "
           "relays while answering every group API itself (default: none, standalone coordinator)",
           "HOST:PORT,..."),
    Option("--broker-port-base", "KCOORD_BROKER_PORT_BASE", bounded_int(0, 65535), _field("broker_port_base"),
           "gateway mode: the listener standing for upstream node N binds port BASE+N (default: any free port)"),
    Option("--broker-advertised-host", "KCOORD_BROKER_ADVERTISED_HOST", str, _field("broker_host"),
           "gateway mode: host name clients are given for the per-broker listeners (default: the advertised "
           "host)", "HOST"),
    Option("--coordinator-node-id", "KCOORD_COORDINATOR_NODE_ID", bounded_int(0), _field("coordinator_node_id"),
           "gateway mode: node id clients are given for kcoord's group coordinator, a broker of its own that "
           "leads no partition, so group requests never wait behind relayed ones (default 1000000000)"),
    Option("--coordinator-port", "KCOORD_COORDINATOR_PORT", bounded_int(0, 65535), _field("coordinator_port"),
           "gateway mode: port of the group coordinator's listener (default 0: any free port)"),
    Option("--upstream-timeout-ms", "KCOORD_UPSTREAM_TIMEOUT_MS", bounded_int(100), _field("upstream_timeout_ms"),
           "gateway mode: longest wait for an upstream connection or reply (beyond a Fetch's own max wait) before "
           "the client's connection is closed (clients retry) (default 30000)"),
    Option("--upstream-refresh-ms", "KCOORD_UPSTREAM_REFRESH_MS", bounded_int(100), _field("upstream_refresh_ms"),
           "gateway mode: how often the upstream's brokers are re-read from its Metadata (default 10000)"),
    Option("--log-level", "KCOORD_LOG_LEVEL", log_level, _field("log_level"),
           "DEBUG, INFO, WARNING or ERROR (default INFO)", "LEVEL"),
    Option("--log-format", "KCOORD_LOG_FORMAT", log_format, _field("log_format"),
           "text, or json: one object per line with time, level, logger, message and fields (default text)",
           "FORMAT"),
]


def _with_cluster(config: Config) -> Config:
    """Checks a cluster's settings; this node's entry is what it advertises."""
    if config.processes > 1:
        _check_processes(config)
    if not config.cluster:
        return config
    mine = [n for n in config.cluster if n.node_id == config.node_id]
    if not mine:
        raise ConfigError(f"--node-id {config.node_id} is not among --cluster's nodes "
                          f"({', '.join(str(n.node_id) for n in config.cluster)})")
    if config.upstream:
        raise ConfigError("--cluster and --upstream cannot be combined: gateway mode runs as one node")
    if config.offsets_partitions < len(config.cluster):
        raise ConfigError(f"--offsets-partitions {config.offsets_partitions} is fewer than the cluster's "
                          f"{len(config.cluster)} nodes: every node must own a partition")
    node = mine[0]
    if config.port == 0:
        raise ConfigError(f"--listen {config.host}:0 with --cluster: the node would listen on a port the system "
                          f"picks while clients are sent to its entry's ({node.host}:{node.port}); listen on that port")
    taken = [n for n in config.cluster if n.node_id != node.node_id and (n.host, n.port) == (config.host, config.port)]
    if taken:
        raise ConfigError(f"--listen {config.host}:{config.port} is node {taken[0].node_id}'s entry in --cluster, not "
                          f"that of --node-id {config.node_id} ({node.host}:{node.port}): check --node-id")
    if config.advertised_host is not None and (config.advertised_host, config.advertised_port) != node[1:]:
        raise ConfigError(f"--advertised-listener {config.advertised_host}:{config.advertised_port} differs from "
                          f"this node's entry in --cluster ({node.host}:{node.port}): give one of them")
    return replace(config, advertised_host=node.host, advertised_port=node.port)


def _check_processes(config: Config) -> None:
    """--processes N: the nodes take N consecutive ports of each listener."""
    n = config.processes
    if config.cluster or config.upstream:
        raise ConfigError(f"--processes {n} runs a cluster of its own: not with --cluster or --upstream")
    if config.port == 0:
        raise ConfigError(f"--processes {n} needs a --listen port (node i listens on it + i), not 0")
    if config.offsets_partitions < n:
        raise ConfigError(f"--offsets-partitions {config.offsets_partitions} is fewer than --processes {n}: "
                          f"every node must own a partition")
    ports = {"--listen": config.port, "--advertised-listener": config.advertised[1]}
    if config.metrics_listen is not None and config.metrics_listen[1]:  # port 0: any free port for each node
        ports["--metrics-listen"] = config.metrics_listen[1]
    for flag, port in ports.items():
        if port + n - 1 > 65535:
            raise ConfigError(f"{flag} port {port} + {n - 1} is beyond 65535 (node i uses the port + i)")
    if "--metrics-listen" in ports and config.metrics_listen is not None:
        metrics_host, metrics_port = config.metrics_listen
        if abs(metrics_port - config.port) < n and may_share_port(metrics_host, config.host):
            port = max(metrics_port, config.port)  # the first port both ranges take
            raise ConfigError(
                f"--processes {n}: node {port - config.port}'s listener ({config.host}:{port}) and node "
                f"{port - metrics_port}'s metrics listener ({metrics_host}:{port}) would bind the same port: the "
                f"listener ports ({config.port} + i) and the metrics ports ({metrics_port} + i) overlap; give "
                f"--metrics-listen a port at least {n} away from --listen's")


def may_share_port(first: str, second: str) -> bool:
    """Whether listeners on hosts ``first`` and ``second`` and one port collide (EADDRINUSE): one host,
    in any spelling of its address, or a wildcard on either side, which binds every address (``::`` the
    IPv4 ones too). Distinct addresses (127.0.0.1 and 127.0.0.2, or two interfaces') do not. An
    IPv4-mapped IPv6 address (``::ffff:127.0.0.1``) is its IPv4 address: a dual-stack socket bound to it
    holds that address's port."""
    if is_wildcard(first) or is_wildcard(second):
        return True
    try:
        return canonical_address(first) == canonical_address(second)
    except ValueError:
        return first.lower() == second.lower()


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags are kept as strings here and parsed in ``config_from_args``, so a bad value from a flag
    and one from a variable are reported the same way, each under its own name."""
    for opt in OPTIONS:
        parser.add_argument(opt.flag, metavar=opt.metavar, default=None, help=f"{opt.help}; env {opt.env}")


def config_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Config:
    """The Config from parsed flags, then ``KCOORD_*`` variables, then defaults; ConfigError if unusable."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for opt in OPTIONS:
        raw = getattr(args, opt.flag[2:].replace("-", "_"))
        source = opt.flag
        if raw is None and environ.get(opt.env):
            raw, source = environ[opt.env], opt.env
        if raw is None:
            continue
        try:
            values.update(opt.apply(opt.parse(raw)))
        except ValueError as exc:
            raise ConfigError(f"{source}={raw!r}: {exc}") from None
    if values.get("processes", 1) > 1 and "node_id" in values:  # each node's id is its index: one given was dropped
        raise ConfigError(f"--processes {values['processes']} numbers its nodes 0 to {values['processes'] - 1} itself: "
                          f"not with --node-id (or KCOORD_NODE_ID) {values['node_id']}")
    config = _with_cluster(replace(Config(), **values))
    if config.group_min_session_timeout_ms > config.group_max_session_timeout_ms:
        raise ConfigError(f"--group-min-session-timeout-ms ({config.group_min_session_timeout_ms}) is above "
                          f"--group-max-session-timeout-ms ({config.group_max_session_timeout_ms})")
    if config.advertised_host is None and is_wildcard(config.host):
        # Kafka refuses to start when it would advertise the 0.0.0.0 meta-address (its advertised
        # listeners default to its listeners); clients given it in FindCoordinator connect nowhere
        raise ConfigError(f"--listen {config.host}:{config.port} listens on every interface, "
                          "which is no address clients can be given: also give --advertised-listener HOST:PORT "
                          "(the name clients reach kcoord at; the container image sets its hostname)")
    if config.broker_host is not None and is_wildcard(config.broker_host):
        raise ConfigError(f"--broker-advertised-host {config.broker_host} means every interface, not a "
                          "host clients can connect to")
    if config.max_buffered_bytes < config.max_frame_bytes + 4:
        raise ConfigError(f"--max-buffered-bytes ({config.max_buffered_bytes}) must be at least --max-frame-bytes "
                          f"+ 4 ({config.max_frame_bytes + 4}), or no frame that large could be read")
    return config
