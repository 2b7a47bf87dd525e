"""A hung disk, for real: kcoord's data directory on an ext4 file system that ``fsfreeze`` stops (as a
volume snapshot or a stalled device does), so every write to it blocks until it is thawed. What the
metrics listener says meanwhile is what an operator is paged on. Needs root to mount a loop device
and freeze it; skipped otherwise."""

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_metrics import get, scrape, value
from tests.kcoord_process import KcoordProcess
from tests.rawclient import RawClient, commit_request


def _run(*cmd: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(list(cmd), capture_output=True, check=False)


@pytest.fixture
def freezable_disk(tmp_path: Path) -> Iterator[Path]:
    image, mount = tmp_path / "disk.img", tmp_path / "ext4"
    mount.mkdir()
    with open(image, "wb") as f:
        f.truncate(64 << 20)
    for cmd in (("mkfs.ext4", "-q", str(image)), ("mount", "-o", "loop", str(image), str(mount)),
                ("fsfreeze", "-f", str(mount)), ("fsfreeze", "-u", str(mount))):
        result = _run(*cmd)
        if result.returncode != 0:
            _run("umount", "-l", str(mount))  # mounted or not
            pytest.skip(f"cannot {' '.join(cmd[:2])} here: {result.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        _run("fsfreeze", "-u", str(mount))  # a frozen file system would hold a kill (D state) and umount
        _run("umount", "-l", str(mount))


def test_a_frozen_disk_shows_as_a_pending_sync_and_an_unready_server(freezable_disk: Path) -> None:
    """Fault campaign: with the file system frozen, the commit's append blocked the event loop before
    its flush cycle counted as under way, so kcoord_sync_pending_seconds read 0 for as long as the disk
    was hung and KcoordSyncStuck, the alert written for "a hung disk or volume", could never fire;
    after the thaw the log said the sync had been pending for 44 s. The cycle now counts from its
    appends, as the gauge's docstring says. And /readyz (the container's HEALTHCHECK, kcoord_ready)
    answered 200 "ready" all along, from its own thread, while the server answered nothing: a Service
    kept sending clients to it. It is now 503 while /healthz is (the event loop stalled for 10 s)."""
    server = KcoordProcess(freezable_disk / "data", "--offsets-partitions", "4")
    server.log_path = freezable_disk.parent / "kcoord.log"  # not on the frozen disk
    server.start()
    client = RawClient(server.port, timeout=60)
    outcome: list[Any] = []
    second = commit_request("frozen", {("t", 0): 2})
    committer = threading.Thread(target=lambda: outcome.append(client.call(second, 8)))
    try:
        assert client.call(commit_request("frozen", {("t", 0): 1}), 8).topics[0].partitions[0].error_code == 0
        assert _run("fsfreeze", "-f", str(freezable_disk)).returncode == 0
        committer.start()
        deadline = time.monotonic() + 30
        while (pending := value(scrape(server), "kcoord_sync_pending_seconds")) < 1.0:
            assert time.monotonic() < deadline, f"kcoord_sync_pending_seconds stayed {pending} on a frozen disk"
            time.sleep(0.2)
        while get(server.metrics_url + "/healthz")[0] != 503:  # the event loop blocked in the append
            assert time.monotonic() < deadline + 30, "/healthz never saw the event loop stall"
            time.sleep(0.2)
        status, body = get(server.metrics_url + "/readyz")
        assert status == 503 and "stalled" in json.loads(body)["event_loop"], body
        assert value(scrape(server), "kcoord_ready") == 0
        while value(scrape(server), "kcoord_event_loop_lag_seconds") <= 10:  # KcoordEventLoopStalled's condition
            assert time.monotonic() < deadline + 60, "kcoord_event_loop_lag_seconds stopped growing"
            time.sleep(0.2)
        assert _run("fsfreeze", "-u", str(freezable_disk)).returncode == 0
        committer.join(60)
        assert outcome and outcome[0].topics[0].partitions[0].error_code == 0  # acknowledged once thawed
        deadline = time.monotonic() + 30
        while value(scrape(server), "kcoord_sync_pending_seconds") != 0.0:
            assert time.monotonic() < deadline, "the thawed cycle still counts as pending"
            time.sleep(0.2)
        client.sock.close()
        assert server.stop() == 0
    finally:  # a failed check must not leave the server (and the loop device under it) behind
        _run("fsfreeze", "-u", str(freezable_disk))
        if server.proc is not None and server.proc.poll() is None:
            server.kill()
