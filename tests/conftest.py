"""Shared fixtures: a real kcoord server process per test that needs one, and a place for tests to
report what they measured (latencies, memory, times to recover). Figures are printed at the end of the
run; no test asserts a wall-clock time."""

import os
import shutil
import subprocess
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


KAFKAJS_VERSION = "2.2.4"
CACHE = Path(os.environ.get("KCOORD_TEST_CACHE", Path.home() / ".cache" / "kcoord-tests"))


@pytest.fixture(scope="session")
def kafkajs() -> Path:
    """A directory whose node_modules holds kafkajs (npm install on first use, into a cache directory
    outside the repository); the test skips, saying why, without node and npm."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node/npm not installed: kafkajs tests need them")
    home = CACHE / f"kafkajs-{KAFKAJS_VERSION}"
    if not (home / "node_modules" / "kafkajs").exists():
        home.mkdir(parents=True, exist_ok=True)
        result = subprocess.run([npm, "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(home),
                                 f"kafkajs@{KAFKAJS_VERSION}"], capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            pytest.skip(f"npm install kafkajs failed: {result.stderr[-500:]}")
    return home


def run_kafkajs(home: Path, script: Path, *args: str, timeout: float = 120) -> "subprocess.CompletedProcess[str]":
    """``node script args...`` with the kafkajs of ``home`` (the ``kafkajs`` fixture) importable."""
    env = dict(os.environ, NODE_PATH=str(home / "node_modules"))
    return subprocess.run(["node", str(script), *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="session")
def kcat() -> str:
    """kcat's path (apt-get install on first use when running as root); the test skips, saying why, without."""
    found = shutil.which("kcat")
    if found is None and shutil.which("apt-get") and os.geteuid() == 0:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        install = ["apt-get", "install", "-y", "-q", "kcat"]
        if subprocess.run(install, capture_output=True, timeout=600, env=env).returncode != 0:
            # a fresh machine may have no package lists yet
            subprocess.run(["apt-get", "update", "-q"], capture_output=True, timeout=600, env=env)
            subprocess.run(install, capture_output=True, timeout=600, env=env)
        found = shutil.which("kcat")
    if found is None:
        pytest.skip("kcat is not installed and could not be (apt-get install -y kcat needs root and Debian)")
    return found


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
