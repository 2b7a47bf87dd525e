"""What an operator sees when something is wrong: clear messages, exit code 2, no traceback, nothing
left behind, and no log storm."""

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from protocol.partitioning import partition_for
from tests.kcoord_process import REPO, KcoordProcess, free_port
from tests.rawclient import RawClient, commit_request, fetch_request


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "coordinator.cli", "serve", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60)


def test_a_port_in_use_fails_before_creating_the_data_directory(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = serve("--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "data"))
    assert result.returncode == 2
    assert "cannot start" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "data").exists()


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Callable[[Path], None]]:
    mounted: list[Path] = []

    def make_read_only(path: Path) -> None:
        for cmd in (["mount", "--bind", str(path), str(path)], ["mount", "-o", "remount,ro,bind", str(path)]):
            result = subprocess.run(cmd, capture_output=True)
            if result.returncode != 0:
                pytest.skip(f"cannot make a read-only bind mount here: {result.stderr.decode().strip()}")
        mounted.append(path)

    yield make_read_only
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_an_unwritable_data_directory_is_a_clear_error(tmp_path: Path, read_only: Callable[[Path], None]) -> None:
    data = tmp_path / "data"
    KcoordProcess(data).start().stop()
    read_only(data)
    result = serve("--listen", f"127.0.0.1:{free_port()}", "--data-dir", str(data))
    assert result.returncode == 2
    assert f"data directory {data} is not writable (Read-only file system)" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_unwritable_partition_serves_reads_refuses_commits_and_says_so_once(
    tmp_path: Path, read_only: Callable[[Path], None]
) -> None:
    data = tmp_path / "data"
    group = "stuck-group"
    partition = partition_for(group, 50)
    server = KcoordProcess(data).start()
    client = RawClient(server.port)
    assert client.call(commit_request(group, {("t", 0): 7}), 8).topics[0].partitions[0].error_code == 0
    client.close()
    server.stop()
    read_only(data / f"__consumer_offsets-{partition}")
    server.start()
    client = RawClient(server.port)
    assert client.call(fetch_request(group, {"t": [0]}), 7).topics[0].partitions[0].committed_offset == 7
    refused = client.call(commit_request(group, {("t", 0): 8}), 8)
    assert refused.topics[0].partitions[0].error_code == 16  # NOT_COORDINATOR: clients retry
    other = client.call(commit_request("another-group", {("t", 0): 1}), 8)  # other partitions are fine
    assert partition_for("another-group", 50) != partition
    assert other.topics[0].partitions[0].error_code == 0
    time.sleep(3)
    log = server.log_since_start()
    assert f"partition {partition}: its log cannot be written (Read-only file system" in log
    assert log.count(f"partition {partition}:") < 6  # a persisting problem is not logged ten times a second
    client.close()
    assert server.stop() == 0


def test_debug_logs_connections_and_requests(tmp_path: Path) -> None:
    server = KcoordProcess(tmp_path / "data", "--log-level", "DEBUG").start()
    client = RawClient(server.port)
    client.call(commit_request("debug-group", {("t", 0): 1}), 8)
    client.close()
    time.sleep(0.2)
    log = server.log_since_start()
    server.stop()
    assert ": connected" in log
    assert "OffsetCommit v8 correlation 1 client 'kcoord-tests'" in log
