"""The sync helper process of a real kcoord (storage.synchelper), faulted for real: stopped, commits
wait unanswered (nothing is acknowledged before it is durable); killed, the commit in flight is
refused (its sync may not have happened) and later ones are made durable by the writer thread; after
a restart every acknowledged offset is there and a new helper serves again."""

import os
import signal
import socket
import time
from pathlib import Path

import pytest

from tests.integration.test_metrics import scrape, value
from tests.kcoord_process import KcoordProcess
from tests.rawclient import RawClient, commit_request, fetch_request

NOT_COORDINATOR = 16


def children(pid: int) -> list[int]:
    """Live (not zombie) child processes of ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid and stat[0] != "Z":
                found.append(int(entry.name))
    return found


def helper_pid(server: KcoordProcess) -> int:
    """The server's only child process."""
    assert server.proc is not None
    (pid,) = children(server.proc.pid)
    return pid


def commit(client: RawClient, offset: int) -> int:
    reply = client.call(commit_request("sync-helper", {("t", 0): offset}), 8)
    return int(reply.topics[0].partitions[0].error_code)


def committed(client: RawClient) -> int:
    reply = client.call(fetch_request("sync-helper", {"t": [0]}), 7)
    return int(reply.topics[0].partitions[0].committed_offset)


def test_a_stopped_then_killed_helper_acknowledges_nothing_early_and_loses_nothing(tmp_path: Path) -> None:
    server = KcoordProcess(tmp_path / "data").start()
    try:
        client = RawClient(server.port)
        for offset in range(1, 6):  # the first cycle creates the segment (the writer thread's); then the helper
            assert commit(client, offset) == 0
        samples = scrape(server)
        assert value(samples, "kcoord_flush_syncs_total", by="helper") >= 4
        assert value(samples, "kcoord_sync_helper_up") == 1
        pid = helper_pid(server)

        os.kill(pid, signal.SIGSTOP)
        client.send(commit_request("sync-helper", {("t", 0): 6}), 8)
        client.sock.settimeout(0.5)
        with pytest.raises(socket.timeout):  # appended, not durable: not answered
            client.sock.recv(1, socket.MSG_PEEK)
        assert value(scrape(server), "kcoord_sync_pending_seconds") >= 0.4  # what KcoordSyncStuck watches
        client.sock.settimeout(10)
        os.kill(pid, signal.SIGKILL)
        _, reply = client.receive(8, 8)
        assert reply.topics[0].partitions[0].error_code == NOT_COORDINATOR  # its sync may not have happened

        deadline = time.monotonic() + 20
        while (error := commit(client, 7)) != 0:  # as a client retries while the partition reloads
            assert error == NOT_COORDINATOR and time.monotonic() < deadline
            time.sleep(0.05)
        writer_syncs = value(scrape(server), "kcoord_flush_syncs_total", by="writer_thread")
        for offset in range(8, 11):
            assert commit(client, offset) == 0
        samples = scrape(server)
        assert value(samples, "kcoord_sync_helper_up") == 0 and value(samples, "kcoord_sync_helper_configured") == 1
        assert value(samples, "kcoord_sync_pending_seconds") == 0
        assert value(samples, "kcoord_flush_syncs_total", by="writer_thread") >= writer_syncs + 3
        assert committed(client) == 10
        client.close()
        log = server.log_since_start()
        assert f"the sync helper process (pid {pid}) exited" in log
        assert "syncing from the writer thread from now on" in log

        assert server.stop() == 0
        server.start()
        client = RawClient(server.port)
        assert committed(client) == 10
        assert commit(client, 11) == 0 and commit(client, 12) == 0
        assert value(scrape(server), "kcoord_sync_helper_up") == 1
        assert helper_pid(server) != pid
        client.close()
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.kill()


def test_with_the_helper_off_the_writer_thread_makes_every_sync(tmp_path: Path) -> None:
    server = KcoordProcess(tmp_path / "data", "--sync-helper", "off").start()
    try:
        client = RawClient(server.port)
        for offset in range(1, 6):
            assert commit(client, offset) == 0
        samples = scrape(server)
        assert value(samples, "kcoord_flush_syncs_total", by="writer_thread") >= 5
        assert value(samples, "kcoord_flush_syncs_total", by="helper") == 0
        assert value(samples, "kcoord_sync_helper_up") == 0 and value(samples, "kcoord_sync_helper_configured") == 0
        assert server.proc is not None
        assert children(server.proc.pid) == []
        client.close()
        assert server.stop() == 0
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.kill()

