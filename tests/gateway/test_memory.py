"""A gateway's closed client connections are freed when they close, not at the next full collection of
the cyclic garbage collector, which kcoord's thresholds make rare: a fault campaign saw a gateway's RSS
grow from 59 to 778 MB over three rounds of ~600 short-lived connections (each connection and its links
referred to each other, and a relayed Metadata request's callbacks to one another; a link that could
not connect to its broker, in a cycle with the event loop's exception, held its client's connection)."""

import os
import signal
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka.protocol.metadata import MetadataRequest

from tests.gateway.conftest import node_ports, start_gateway
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.mock_cluster import MockCluster
from tests.kcoord_process import KcoordProcess
from tests.rawclient import RawClient

# Loaded by kcoord at start (KCOORD_TEST_PYTHONPATH): the cyclic collector never runs, so only what
# reference counting frees is freed; SIGUSR2 writes how many closed connections are still in memory.
SITECUSTOMIZE = '''
import gc, os, signal

gc.disable()
gc.enable = gc.set_threshold = gc.collect = lambda *args, **kwargs: 0

def _count(signum, frame):
    closed = sum(1 for o in gc.get_objects()
                 if type(o).__name__ == "Connection" and type(o).__module__ == "coordinator.connection"
                 and getattr(o, "closed", False))
    path = os.environ["KCOORD_TEST_COUNT_FILE"]
    with open(path + ".tmp", "w") as f:
        f.write(str(closed))
    os.replace(path + ".tmp", path)

signal.signal(signal.SIGUSR2, _count)
'''


@pytest.fixture
def count_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where a kcoord started in the test writes its count (the sitecustomize on its path)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    monkeypatch.setenv("KCOORD_TEST_PYTHONPATH", str(site))
    monkeypatch.setenv("KCOORD_TEST_COUNT_FILE", str(tmp_path / "closed-connections"))
    return tmp_path / "closed-connections"


@pytest.fixture
def counted_gateway(tmp_path: Path, count_file: Path) -> Iterator[tuple[KcoordProcess, Path]]:
    upstream = MockCluster(3)
    try:
        kcoord = start_gateway(tmp_path, upstream.bootstrap)
        try:
            yield kcoord, count_file
        finally:
            kcoord.stop()
    finally:
        upstream.stop()


def closed_in_memory(kcoord: KcoordProcess, count_file: Path) -> int:
    count_file.unlink(missing_ok=True)
    assert kcoord.proc is not None
    os.kill(kcoord.proc.pid, signal.SIGUSR2)
    deadline = time.monotonic() + 30
    while not count_file.exists():
        assert time.monotonic() < deadline, "kcoord did not count its connections"
        time.sleep(0.05)
    return int(count_file.read_text())


def test_closed_connections_that_relayed_metadata_are_freed_without_the_cyclic_collector(
        counted_gateway: tuple[KcoordProcess, Path]) -> None:
    kcoord, count_file = counted_gateway
    assert closed_in_memory(kcoord, count_file) == 0  # the count itself works: nothing closed yet
    for _ in range(20):
        with RawClient(kcoord.port) as client:
            assert client.call(MetadataRequest(topics=[]), 1).brokers  # relayed to the upstream, rewritten
    left = closed_left(kcoord, count_file)
    assert left == 0, f"{left} of 20 closed connections are still in memory"


def closed_left(kcoord: KcoordProcess, count_file: Path) -> int:
    deadline = time.monotonic() + 30  # each close reaches kcoord in its own time
    while (left := closed_in_memory(kcoord, count_file)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


PRODUCE_V3 = struct.pack(">hhih", 0, 3, 9, 4) + b"test" + struct.pack(">hhii", -1, 1, 1000, 0)  # acks=1, no topics


def produce_reply(port: int) -> bytes:
    """A Produce, relayed as is (one broker, no fail-over): its reply, or b"" if kcoord closed the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(struct.pack(">i", len(PRODUCE_V3)) + PRODUCE_V3)
        try:
            return sock.recv(64)
        except ConnectionResetError:
            return b""


@pytest.mark.parametrize("broker", ["answers", "refuses", "never answers"])
def test_closed_connections_that_relayed_a_produce_are_freed_without_the_cyclic_collector(
        tmp_path: Path, count_file: Path, broker: str) -> None:
    """Answered, or closed by kcoord because the broker's link failed. A link refused at connect was left in
    a cycle with the event loop's exception and frames, and held its client's closed connection (10 of 10
    before the fix); one failed by the timeout sweeper stayed a local of the sweeper (the last: 1 of 5)."""
    fake = FakeUpstream(3)
    kcoord = start_gateway(tmp_path, fake.bootstrap, "--upstream-timeout-ms", "1000")
    try:
        port = node_ports(kcoord)[1]
        if broker == "refuses":
            fake.refuse(1)
        elif broker == "never answers":
            fake.delay[1] = None
        connections = 5 if broker == "never answers" else 10  # (each waits out the timeout)
        for _ in range(connections):
            assert bool(produce_reply(port)) == (broker == "answers")
        left = closed_left(kcoord, count_file)
        assert left == 0, f"{left} of {connections} closed connections are still in memory"
    finally:
        kcoord.stop()
        fake.stop()
