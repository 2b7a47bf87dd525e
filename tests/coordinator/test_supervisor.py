"""The nodes ``--processes`` makes of one setting (coordinator.supervisor.node_configs)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.cluster import Node
from coordinator.config import ConfigError
from coordinator.supervisor import node_configs
from tests.coordinator.test_cli import parse


def test_node_i_takes_the_ports_plus_i_and_a_directory_of_its_own() -> None:
    config = parse(["--processes", "3", "--listen", "0.0.0.0:9092", "--advertised-listener", "coord.example:19092",
                    "--metrics-listen", "0.0.0.0:9404", "--data-dir", "/var/lib/kcoord"])
    nodes = node_configs(config)
    expected = tuple(Node(i, "coord.example", 19092 + i) for i in range(3))
    assert [(c.node_id, c.port, c.advertised, c.data_dir, c.metrics_listen, c.processes) for c in nodes] == [
        (i, 9092 + i, ("coord.example", 19092 + i), Path(f"/var/lib/kcoord/node-{i}"), ("0.0.0.0", 9404 + i), 1)
        for i in range(3)]
    assert all(c.cluster == expected for c in nodes)


def test_metrics_on_any_free_port_stay_so_for_every_node() -> None:
    config = parse(["--processes", "2", "--metrics-listen", "127.0.0.1:0"])
    assert [c.metrics_listen for c in node_configs(config)] == [("127.0.0.1", 0), ("127.0.0.1", 0)]
    assert [c.metrics_listen for c in node_configs(parse(["--processes", "2", "--metrics-listen", "off"]))] == [
        None, None]



WILDCARD = ["--advertised-listener", "coord.example:9092"]


@pytest.mark.parametrize("argv", [
    ["--listen", "0.0.0.0:9092", *WILDCARD, "--metrics-listen", "127.0.0.1:9093"],  # the image's listener
    ["--listen", "127.0.0.1:9092", "--metrics-listen", "0.0.0.0:9091"],
    ["--listen", "[::]:9092", *WILDCARD, "--metrics-listen", "127.0.0.1:9093"],  # :: binds IPv4 too
    ["--listen", "[::1]:9092", "--metrics-listen", "[0:0:0:0:0:0:0:1]:9093"],  # one address, two spellings
    ["--listen", "kc.example:9404", "--metrics-listen", "KC.example:9405"],
    ["--listen", "127.0.0.1:9092", "--metrics-listen", "[::ffff:127.0.0.1]:9093"],  # IPv4-mapped: binds 127.0.0.1
    ["--listen", "127.0.0.1:9092", "--metrics-listen", "127.1:9093"],  # an IPv4 shorthand binds 127.0.0.1 too
])
def test_listener_and_metrics_ports_that_collide_on_any_host_are_refused_up_front(argv: list[str]) -> None:
    """Node 1 listening on 0.0.0.0:9093 and node 0's metrics on 127.0.0.1:9093 cannot both bind: only
    a metrics host equal to the listen host was compared, so such a start was refused later, by a node,
    with "address already in use". Refused at the start instead, naming the port and both listeners."""
    with pytest.raises(ConfigError, match=r"would bind the same port.*overlap"):
        parse(["--processes", "2", *argv])


@pytest.mark.parametrize("argv", [
    ["--listen", "127.0.0.1:9092", "--metrics-listen", "127.0.0.2:9093"],  # two addresses: no collision
    ["--listen", "0.0.0.0:9092", *WILDCARD, "--metrics-listen", "127.0.0.1:9094"],  # ports 9092-3, 9094-5
    ["--listen", "0.0.0.0:9092", *WILDCARD, "--metrics-listen", "0.0.0.0:0"],  # any free port for each
])
def test_listener_and_metrics_ports_that_cannot_collide_are_accepted(argv: list[str]) -> None:
    assert parse(["--processes", "2", *argv]).processes == 2


@pytest.mark.parametrize(("argv", "environ"), [(["--node-id", "1"], {}), ([], {"KCOORD_NODE_ID": "0"})])
def test_a_node_id_with_processes_is_refused(argv: list[str], environ: dict[str, str]) -> None:
    """node_configs numbers the nodes 0..N-1 whatever --node-id said: a node id given was silently dropped."""
    with pytest.raises(ConfigError, match="numbers its nodes 0 to 1 itself: not with --node-id"):
        parse(["--processes", "2", *argv], environ)


def _supervised_slow_start(tmp_path: Path, slow_nodes: str = "0,1",
                           slow_fork_of: str = "") -> "subprocess.Popen[bytes]":
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2]), SLOW_NODES=slow_nodes, SLOW_FORK_OF=slow_fork_of)
    return subprocess.Popen([sys.executable, str(Path(__file__).parent / "supervised_slow_start.py"), str(tmp_path)],
                            env=env, stderr=subprocess.PIPE)


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _stopped_within_10_s(proc: "subprocess.Popen[bytes]", tmp_path: Path) -> None:
    """SIGTERM to the supervisor, which must then exit within 10 s (the test fails naming the nodes that ran)."""
    import signal
    import subprocess

    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the supervisor still waits 10 s after SIGTERM; nodes ran: "
                    f"{sorted(p.name for p in tmp_path.glob('*.ran'))}")


def _forked(proc: "subprocess.Popen[bytes]", count: int = 2) -> list[int]:
    """The supervisor's nodes once it has forked ``count`` (its imports take ~0.5 s, several seconds on
    a loaded host: a fixed sleep of 0.7 s found one node, or none)."""
    import time

    deadline = time.monotonic() + 30
    while len(children := _children(proc.pid)) < count:
        assert proc.poll() is None and time.monotonic() < deadline, f"{len(children)} nodes forked"
        time.sleep(0.01)
    return children


def test_a_stop_during_a_nodes_start_stops_it(tmp_path: Path) -> None:
    """SIGTERM to the supervisor while a node is between its fork and its own signal handling: the node
    ran the supervisor's inherited handler instead (swallowing the SIGTERM, signalling its siblings), then
    served on, and the supervisor waited for it forever."""
    import signal

    proc = _supervised_slow_start(tmp_path)
    try:
        _forked(proc)  # both nodes forked, neither past the slowed start (1.5 s)
        _stopped_within_10_s(proc, tmp_path)
    finally:
        for child in _children(proc.pid) if proc.poll() is None else []:
            os.kill(child, signal.SIGKILL)
        proc.kill()
        proc.wait()


def test_a_sighup_to_a_starting_node_does_not_stop_its_siblings(tmp_path: Path) -> None:
    """A node keeps the supervisor's SIGHUP handler (only SIGINT and SIGTERM are reset): a SIGHUP to it
    before its server installs its own handlers makes it SIGTERM its elder siblings."""
    import signal
    import time

    proc = _supervised_slow_start(tmp_path, slow_nodes="1")  # node 0 runs at once
    try:
        node0, node1 = _forked(proc)  # node 1 still in its slowed start (1.5 s)
        os.kill(node1, signal.SIGHUP)
        time.sleep(2.5)
        assert (tmp_path / "node-0.ran").exists()
        assert os.path.exists(f"/proc/{node0}"), "node 0 was stopped by node 1's SIGHUP"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except Exception:
            for child in _children(proc.pid):
                os.kill(child, signal.SIGKILL)
            proc.kill()
            proc.wait()


def test_a_stop_arriving_just_before_a_node_starts_again_starts_nothing(tmp_path: Path) -> None:
    """A SIGTERM whose handler ran between run()'s look at _stopping (a restart falling due) and _start
    blocking the stop signals: _stop_all found no process for that node, and _start then forked it
    anyway, so the supervisor waited for ever for a node nothing would stop."""
    from coordinator.supervisor import Supervisor

    supervisor = Supervisor(parse(["--processes", "2", "--data-dir", str(tmp_path)]), lambda config: 0)
    started: list[str] = []

    class Forked:
        def __init__(self, name: str) -> None:
            self.name = name

        def start(self) -> None:
            started.append(self.name)

    class Context:
        def Process(self, target: object, args: object, name: str) -> Forked:  # multiprocessing's name
            supervisor._stop_all()  # the handler, run as the node is about to start
            return Forked(name)

    supervisor._context = Context()
    supervisor._start(1)
    assert started == [] and supervisor._procs[1] is None


def test_a_stop_just_before_a_node_is_forked_leaves_nothing_running(tmp_path: Path) -> None:
    """SIGTERM to the supervisor after node 0 is forked and before node 1's _start blocks the stop
    signals (a window widened to 1.5 s here): _stop_all stopped node 0, then node 1 was forked anyway,
    and the supervisor waited for ever for a node nothing would stop."""
    import signal
    import time

    proc = _supervised_slow_start(tmp_path, slow_nodes="none", slow_fork_of="1")
    try:
        _forked(proc, 1)
        deadline = time.monotonic() + 30
        while not (tmp_path / "about-to-fork").exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        _stopped_within_10_s(proc, tmp_path)
        assert not (tmp_path / "node-1.ran").exists()
    finally:
        for child in _children(proc.pid) if proc.poll() is None else []:
            os.kill(child, signal.SIGKILL)
        proc.kill()
        proc.wait()
