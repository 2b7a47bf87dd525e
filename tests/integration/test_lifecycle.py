"""Start-up and shutdown as an operator sees them."""

import signal
import subprocess
import sys
import threading
from pathlib import Path

from tests.kcoord_process import REPO, KcoordProcess
from tests.rawclient import RawClient, commit_request, fetch_request


def test_sigterm_finishes_parked_commits_and_exits_0(kcoord: KcoordProcess) -> None:
    client = RawClient(kcoord.port)
    frames = [client.encode(commit_request("graceful", {("t", 0): i}), 8)[1] for i in range(2000)]
    threading.Thread(target=lambda: [client.sock.sendall(f) for f in frames], daemon=True).start()
    acked = -1
    for _ in range(300):
        _, response = client.receive(8, 8)
        if response.topics[0].partitions[0].error_code == 0:
            acked += 1
    assert kcoord.proc is not None
    kcoord.proc.send_signal(signal.SIGTERM)
    try:
        while True:
            _, response = client.receive(8, 8)
            if response.topics[0].partitions[0].error_code == 0:
                acked += 1
    except (ConnectionError, OSError):
        pass
    assert kcoord.proc.wait(30) == 0
    assert "kcoord stopped" in kcoord.log()
    client.close()
    kcoord.start()
    reader = RawClient(kcoord.port)
    got = reader.call(fetch_request("graceful", {"t": [0]}), 7)
    assert got.topics[0].partitions[0].committed_offset >= acked
    reader.close()


def test_refuses_a_different_partition_count_for_existing_data(tmp_path: Path) -> None:
    server = KcoordProcess(tmp_path / "data").start()
    server.stop()
    result = subprocess.run(
        [sys.executable, "-m", "coordinator.cli", "serve", "--data-dir", str(tmp_path / "data"),
         "--offsets-partitions", "10", "--listen", "127.0.0.1:0"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert "offsets topic of 50 partitions" in result.stderr


def test_a_damaged_meta_file_is_a_clear_error(tmp_path: Path) -> None:
    data = tmp_path / "data"
    KcoordProcess(data).start().stop()
    (data / "kcoord.meta.json").write_text('{"offsets_partit')
    result = subprocess.run(
        [sys.executable, "-m", "coordinator.cli", "serve", "--data-dir", str(data), "--listen", "127.0.0.1:0"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert "kcoord.meta.json is damaged" in result.stderr
