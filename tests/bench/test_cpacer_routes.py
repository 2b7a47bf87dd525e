"""bench/cpacer.py's cluster run, one C pacer per node, with a stand-in for bench/pacer.c (it speaks the
program's output: window lines, the JSON counts and the latency file), so the merge of the nodes'
samples and a node's failure are seen without a server or a C compiler."""

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from bench import cpacer
from bench.client import Checker, Load, Route, Sample
from bench.report import slow_bursts
from bench.scenarios import SCENARIOS, build_load
from bench.wire import Tolerance, Versions

# argv: host port connections inflight rate warmup duration ring tmp. The port says what to do:
# 1: 10,000 answers in 10 s, every 8th of the first 960 slow (8 ms apart: single slow requests, no queue); 2: 10,000
# fast ones; 3: fail at once; 4: write its pid to $PACER_PID and run on for 30 s.
FAKE = '''
import array, json, os, sys, time
port, tmp = int(sys.argv[2]), sys.argv[9]
if port == 3:
    sys.exit(1)
if port == 4:
    open(os.environ["PACER_PID"], "w").write(str(os.getpid()))
    time.sleep(30)
lat = array.array("d", [0.05 if port == 1 and k % 8 == 0 and k < 960 else 0.001 for k in range(10_000)])
open(os.path.join(tmp, "latencies.f64"), "wb").write(lat.tobytes())
for name in ("bodies.bin", "odd.bin"):
    open(os.path.join(tmp, name), "wb").close()
print("window-start")
print("window-end 10.0 0.1")
print(json.dumps({"responses": 10_000, "answered": 10_000, "unanswered": 0, "late": 3, "held": 2, "odd": 0,
                  "out_of_order": 0, "lost_connections": 0}), flush=True)
'''


@pytest.fixture
def program(tmp_path: Path) -> Path:
    path = tmp_path / "pacer"
    path.write_text(f"#!{sys.executable}\n{FAKE}")
    path.chmod(0o755)
    return path


def _run(program: Path, ports: list[int]) -> Sample:
    load = build_load(SCENARIOS["commit-1-half"], 4)
    checker = Checker(load.slots, Versions(commit=8, fetch=9), Tolerance())
    routes = [Route("127.0.0.1", port, Load(load.slots, load.order), 1) for port in ports]
    cpu = iter(range(100))
    return asyncio.run(cpacer.measure_routes(program, routes, checker, inflight=1, warmup=0.0, duration=10.0,
                                             server_cpu=lambda: float(next(cpu)), rate=2000.0))


def test_the_nodes_latencies_are_merged_in_time_order(program: Path) -> None:
    """Node 1's slow requests came 8 ms apart (single slow syncs): report.slow_bursts reads latency i
    as ~i/rate into the window, so the merged sample must keep the nodes' answers interleaved; one
    node's after the other's put them 4 ms apart at the cluster's rate, one "queue" of 120."""
    sample = _run(program, [1, 2])
    assert sample.requests == 20_000 == len(sample.latencies) and sample.requests_by_route == [10_000, 10_000]
    assert (sample.late, sample.held, sample.seconds) == (6, 4, 10.0)
    bursts = slow_bursts(sample.latencies, sample.requests / sample.seconds)
    assert bursts is not None and bursts["slow"] == 120
    assert bursts["long_bursts"] == 0 and bursts["longest_ms"] == 0, bursts


def test_a_node_whose_pacer_fails_stops_the_others(program: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """One pacer failing fails the run; the other node's pacer must not run on (sending load to the
    cluster while the harness stops it, or during the next server's measurement)."""
    pid_file = tmp_path / "pid"
    monkeypatch.setenv("PACER_PID", str(pid_file))
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="failed"):
        _run(program, [4, 3])
    assert time.monotonic() - started < 20
    deadline = time.monotonic() + 5
    while not pid_file.exists() and time.monotonic() < deadline - 3:
        time.sleep(0.05)
    if not pid_file.exists():
        return  # killed before it wrote its pid
    pid = int(pid_file.read_text())
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    pytest.fail(f"node 0's pacer (pid {pid}) still running after the run failed")
