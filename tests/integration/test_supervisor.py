"""``kcoord serve --processes N`` (coordinator.supervisor): a cluster of N nodes on one host from one
command, watched: a node that dies starts again, a refused one stops them all, a stop stops them all,
and none outlives the supervisor."""

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata

from tests.integration.test_cluster import commit, groups_of, raw_offset
from tests.kcoord_process import REPO, KcoordProcess, free_port, wait_port

TIMEOUT = 30.0


def consecutive_ports(count: int) -> int:
    """The first of ``count`` consecutive free loopback ports."""
    for _ in range(100):
        first = free_port()
        taken = []
        try:
            for port in range(first, first + count):
                s = socket.socket()
                taken.append(s)
                s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for s in taken:
                s.close()
        return first
    raise RuntimeError("no consecutive free ports")


class Supervised:
    """``kcoord serve --processes 2``; ``nodes`` stand for its nodes (their ports and data directories)."""

    def __init__(self, root: Path, *extra: str) -> None:
        self.port, self.metrics = consecutive_ports(2), consecutive_ports(2)
        self.data_dir = root / "data"
        self.log_path = root / "supervisor.log"
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.nodes = [KcoordProcess(self.data_dir / f"node-{i}", port=self.port + i) for i in range(2)]
        for i, node in enumerate(self.nodes):
            node.metrics_port = self.metrics + i

    def start(self) -> "Supervised":
        cmd = [sys.executable, "-m", "coordinator.cli", "serve", "--processes", "2", "--listen",
               f"127.0.0.1:{self.port}", "--metrics-listen", f"127.0.0.1:{self.metrics}", "--data-dir",
               str(self.data_dir), *self.extra]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                         env=dict(os.environ, PYTHONPATH=str(REPO)))
        for node in self.nodes:
            wait_port(node.port, self.proc, self.log_path)
        self.wait_for("node-0 coordinator.runtime: all 25 partitions loaded", "node-1 coordinator.runtime: all 25")
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, *texts: str, count: int = 1) -> None:
        deadline = time.monotonic() + TIMEOUT
        while not all(self.log().count(t) >= count for t in texts):
            assert time.monotonic() < deadline, f"no {texts} in:\n{self.log()}"
            time.sleep(0.05)

    def node_pids(self) -> list[int]:
        assert self.proc is not None
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]


@pytest.fixture
def supervised(tmp_path: Path) -> Iterator[Supervised]:
    s = Supervised(tmp_path).start()
    yield s
    if s.proc is not None and s.proc.poll() is None:
        s.proc.kill()
        s.proc.wait(TIMEOUT)


def test_the_nodes_form_a_cluster_that_stock_clients_use(supervised: Supervised) -> None:
    assert sorted(p.name for p in supervised.data_dir.iterdir()) == ["node-0", "node-1"]
    for i, group in enumerate(groups_of(0, 1, "s") + groups_of(1, 1, "s")):
        consumer = KafkaConsumer(bootstrap_servers=supervised.nodes[0].bootstrap, group_id=group,
                                 enable_auto_commit=False, request_timeout_ms=10_000)
        try:
            consumer.commit({TopicPartition("t", 0): OffsetAndMetadata(40 + i, "", -1)}, timeout_ms=10_000)
        finally:
            consumer.close()
        assert raw_offset(supervised.nodes[i], group, "t", 0) == (0, 40 + i)
    log = supervised.log()
    assert "node-1 coordinator.server: cluster mode: node 1 of nodes" in log
    assert "cluster of 2 nodes on one host" in log


def test_a_killed_node_starts_again_with_its_acknowledged_commits(supervised: Supervised) -> None:
    group = groups_of(1, 1, "again")[0]
    assert commit(supervised.nodes[1].port, group, 9) == 0
    started = re.search(r"INFO node-1 kcoord: starting kcoord \S+ on \w+ \(pid (\d+)\)", supervised.log())
    assert started is not None
    victim = int(started.group(1))
    assert victim in supervised.node_pids()
    os.kill(victim, signal.SIGKILL)
    supervised.wait_for("ERROR kcoord: node 1 ended (signal 9)")
    supervised.wait_for("node-1 coordinator.runtime: all 25 partitions loaded", count=2)
    assert raw_offset(supervised.nodes[1], group, "t", 0) == (0, 9)
    assert commit(supervised.nodes[0].port, groups_of(0, 1, "again")[0], 1) == 0


def test_a_stop_stops_every_node_cleanly(supervised: Supervised) -> None:
    assert supervised.proc is not None
    pids = supervised.node_pids()
    assert len(pids) == 2
    supervised.proc.send_signal(signal.SIGTERM)
    assert supervised.proc.wait(TIMEOUT) == 0
    assert supervised.log().count("coordinator.server: kcoord stopped") == 2
    assert not any(Path(f"/proc/{p}").exists() for p in pids)


def test_a_stop_after_a_node_was_restarted_is_clean(supervised: Supervised) -> None:
    """A node killed and started again (long before the stop) is not a failed stop: every node then stops
    cleanly, and the status says so (1 would mark a systemd unit or a container failed after a stop)."""
    assert supervised.proc is not None
    os.kill(supervised.node_pids()[1], signal.SIGKILL)
    supervised.wait_for("node-1 coordinator.runtime: all 25 partitions loaded", count=2)
    supervised.proc.send_signal(signal.SIGTERM)
    assert supervised.proc.wait(TIMEOUT) == 0
    assert supervised.log().count("coordinator.server: kcoord stopped") == 2


def test_processes_on_a_standalone_data_dir_do_not_start_without_its_offsets(tmp_path: Path) -> None:
    """A standalone kcoord's --data-dir given to --processes 2 (KCOORD_PROCESSES=2 set on a running
    deployment): the nodes took DATA_DIR/node-i, empty, and served every group with no committed offset
    while the offsets sat unread in DATA_DIR. As --cluster on a standalone directory: refused (status 2),
    or the offsets served."""
    standalone = KcoordProcess(tmp_path / "data").start()
    group = groups_of(1, 1, "moved")[0]
    try:
        assert commit(standalone.port, group, 7) == 0
    finally:
        assert standalone.stop() == 0
    supervised = Supervised(tmp_path)
    try:
        supervised.start()
        assert raw_offset(supervised.nodes[1], group, "t", 0) == (0, 7), "the standalone's offsets are not served"
    except (AssertionError, RuntimeError):  # RuntimeError: Supervised.start's "exited with 2 before listening"
        assert supervised.proc is not None
        if supervised.proc.wait(TIMEOUT) != 2:
            raise
    finally:
        if supervised.proc is not None and supervised.proc.poll() is None:
            supervised.proc.send_signal(signal.SIGTERM)
            supervised.proc.wait(TIMEOUT)


def test_a_restart_refused_for_a_while_does_not_stop_the_healthy_nodes(supervised: Supervised) -> None:
    """A node that dies is started again; if that start is refused (its port taken meanwhile, say), the
    other nodes, which were serving, are not stopped: the node is tried again, with the backoff."""
    assert supervised.proc is not None
    os.kill(supervised.node_pids()[1], signal.SIGKILL)
    supervised.wait_for("ERROR kcoord: node 1 ended (signal 9)")
    squatter = socket.socket()
    try:
        squatter.bind(("127.0.0.1", supervised.port + 1))
        squatter.listen()
        supervised.wait_for("node-1 kcoord: cannot start")
        time.sleep(1)
        ended = supervised.proc.poll()
        assert ended is None, f"the supervisor ended ({ended}):\n{supervised.log()}"
        assert commit(supervised.nodes[0].port, groups_of(0, 1, "healthy")[0], 3) == 0
    finally:
        squatter.close()
    supervised.wait_for("node-1 coordinator.runtime: all 25 partitions loaded", count=2)


def test_no_node_outlives_a_killed_supervisor(supervised: Supervised) -> None:
    assert supervised.proc is not None
    pids = supervised.node_pids()
    supervised.proc.kill()
    supervised.proc.wait(TIMEOUT)
    deadline = time.monotonic() + TIMEOUT
    while any(Path(f"/proc/{p}").exists() and "Z" not in _state(p) for p in pids):
        assert time.monotonic() < deadline, "a node outlived its supervisor"
        time.sleep(0.05)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def test_a_node_refused_at_its_start_stops_them_all_with_status_2(tmp_path: Path) -> None:
    s = Supervised(tmp_path)
    s.data_dir.mkdir()
    (s.data_dir / "node-1").write_text("not a directory")
    cmd = [sys.executable, "-m", "coordinator.cli", "serve", "--processes", "2", "--listen", f"127.0.0.1:{s.port}",
           "--metrics-listen", "off", "--data-dir", str(s.data_dir)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 2, done.stderr
    assert "node 1 was refused at its start" in done.stderr


@pytest.mark.parametrize(("argv", "says"), [
    (["--cluster", "0@127.0.0.1:9092"], "not with --cluster"),
    (["--listen", "127.0.0.1:0"], "needs a --listen port"),
    (["--listen", "127.0.0.1:65535"], "beyond 65535"),
    (["--listen", "127.0.0.1:9404", "--metrics-listen", "127.0.0.1:9405"], "overlap"),
])
def test_settings_the_nodes_cannot_share_are_refused(argv: list[str], says: str) -> None:
    done = subprocess.run([sys.executable, "-m", "coordinator.cli", "serve", "--processes", "2", *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 2 and says in done.stderr, done.stderr


def test_a_metrics_port_another_nodes_wildcard_listener_takes_is_refused_before_any_node_starts(
        tmp_path: Path) -> None:
    """The image's wildcard listener with metrics on loopback: node 1's listener (0.0.0.0:P+1) and node 0's
    metrics (127.0.0.1:P+1) cannot both bind. Refused with a message saying so, before anything binds or
    is created, not by a node failing with "address already in use"."""
    port = consecutive_ports(3)
    done = subprocess.run(
        [sys.executable, "-m", "coordinator.cli", "serve", "--processes", "2", "--listen", f"0.0.0.0:{port}",
         "--advertised-listener", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{port + 1}", "--data-dir",
         str(tmp_path / "data")], cwd=REPO, capture_output=True, text=True, timeout=60,
        env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 2, done.stderr
    assert f"would bind the same port: the listener ports ({port} + i) and the metrics ports ({port + 1} + i) " \
           "overlap" in done.stderr, done.stderr
    assert not (tmp_path / "data").exists()
