"""Shared fixtures: a real kcoord server process per test that needs one, and a place for tests to
report what they measured (latencies, memory, times to recover). Figures are printed at the end of the
run; no test asserts a wall-clock time."""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kcoord_process import KcoordProcess

_FIGURES: list[str] = []

# A kcoord started by a test without --metrics-listen must not take the default port 9404: two could
# run at once, or the machine may use it. An ephemeral port still exercises the metrics listener.
os.environ["KCOORD_METRICS_LISTEN"] = "127.0.0.1:0"


@pytest.fixture
def kcoord(tmp_path: Path) -> Iterator[KcoordProcess]:
    """A running kcoord (default 50 partitions) with its own data directory; stopped after the test."""
    server = KcoordProcess(tmp_path / "data").start()
    yield server
    if server.proc is not None and server.proc.poll() is None:
        server.kill()


class Report:
    def __init__(self, test: str) -> None:
        self._test = test

    def figure(self, what: str, value: float, unit: str) -> None:
        _FIGURES.append(f"{self._test}: {what} = {value:,.1f} {unit}")


@pytest.fixture
def report(request: pytest.FixtureRequest) -> Report:
    """``report.figure("bystander p99 commit latency", 12.5, "ms")``: shown in the run's summary."""
    return Report(request.node.name)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _FIGURES:
        terminalreporter.section("measured figures (reported, not asserted)")
        for line in _FIGURES:
            terminalreporter.write_line(line)
