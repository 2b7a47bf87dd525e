"""Start-up and shutdown as an operator sees them."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

import pytest

from storage.dirlock import share_directory
from tests.conftest import Report
from tests.integration.test_flow_control import answered_fetches
from tests.kcoord_process import REPO, KcoordProcess
from tests.rawclient import RawClient, commit_request, fetch_request


def test_sigterm_finishes_parked_commits_and_exits_0(kcoord: KcoordProcess) -> None:
    client = RawClient(kcoord.port)
    frames = [client.encode(commit_request("graceful", {("t", 0): i}), 8)[1] for i in range(2000)]
    def send_all() -> None:
        try:
            for f in frames:
                client.sock.sendall(f)
        except OSError:
            pass  # the server stopped and closed the connection: expected once SIGTERM is sent

    threading.Thread(target=send_all, daemon=True).start()
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


def test_sigterm_drops_a_parked_join_with_its_connection(kcoord: KcoordProcess) -> None:
    """A JoinGroup waiting out the initial rebalance delay when kcoord stops is not answered
    NOT_COORDINATOR (KafkaJS then finds no coordinator and gives up for good: a client sweep); its
    connection is closed, as at a crash, which every client retries. The stop is still clean."""
    from kafka.protocol.consumer.group import JoinGroupRequest

    client = RawClient(kcoord.port)
    join = JoinGroupRequest(group_id="parked-at-stop", session_timeout_ms=10_000, rebalance_timeout_ms=60_000,
                            member_id="", group_instance_id=None, protocol_type="consumer",
                            protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"")])
    first = client.call(join, 5)
    assert first.error_code == 79  # MEMBER_ID_REQUIRED
    join.member_id = first.member_id
    client.send(join, 5)  # parked: the group waits 3 s for more members
    time.sleep(0.3)
    assert kcoord.proc is not None
    kcoord.proc.send_signal(signal.SIGTERM)
    with pytest.raises((ConnectionError, OSError)):
        client.receive(11, 5)  # closed, no answer
    assert kcoord.proc.wait(30) == 0
    log = kcoord.log()
    assert "kcoord stopped" in log and "(some requests were not answered" not in log
    assert "kcoord is stopping: a parked JoinGroup is left unanswered" in log
    client.close()


def test_sigterm_answers_the_commit_before_a_parked_join_and_starts_nothing_behind_it(kcoord: KcoordProcess) -> None:
    """Replies go in request order: a commit sent before a parked JoinGroup is answered at a stop (it is
    durable), then the connection closes with the join unanswered. A commit sent behind the join was
    never started (Kafka reads a connection's next request only once the last is answered), so it is
    neither answered nor stored."""
    from kafka.protocol.consumer.group import JoinGroupRequest

    client = RawClient(kcoord.port)
    join = JoinGroupRequest(group_id="parked-ahead", session_timeout_ms=10_000, rebalance_timeout_ms=60_000,
                            member_id="", group_instance_id=None, protocol_type="consumer",
                            protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"")])
    join.member_id = client.call(join, 5).member_id
    client.send(commit_request("before-the-join", {("t", 0): 41}), 8)
    client.send(join, 5)  # parked for the initial delay
    client.send(commit_request("behind-the-join", {("t", 0): 42}), 8)
    time.sleep(0.5)
    assert kcoord.proc is not None
    kcoord.proc.send_signal(signal.SIGTERM)
    assert client.receive(8, 8)[1].topics[0].partitions[0].error_code == 0
    with pytest.raises((ConnectionError, OSError)):
        client.receive(11, 5)  # closed, no answer
    assert kcoord.proc.wait(30) == 0
    client.close()
    kcoord.start()
    reader = RawClient(kcoord.port)
    for group, offset in (("before-the-join", 41), ("behind-the-join", -1)):
        assert reader.call(fetch_request(group, {"t": [0]}), 7).topics[0].partitions[0].committed_offset == offset
    reader.close()


def _serve_once(data_dir: Path, *extra: str) -> "subprocess.CompletedProcess[str]":
    """One ``kcoord serve`` on ``data_dir`` that is expected to refuse to start (it would otherwise
    serve until the timeout)."""
    return subprocess.run(
        [sys.executable, "-m", "coordinator.cli", "serve", "--data-dir", str(data_dir),
         "--listen", "127.0.0.1:0", "--metrics-listen", "off", *extra],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )


def test_refuses_a_different_partition_count_for_existing_data(tmp_path: Path) -> None:
    server = KcoordProcess(tmp_path / "data").start()
    server.stop()
    result = _serve_once(tmp_path / "data", "--offsets-partitions", "10")
    assert result.returncode == 2
    assert "offsets topic of 50 partitions" in result.stderr


def test_a_damaged_meta_file_is_a_clear_error(tmp_path: Path) -> None:
    data = tmp_path / "data"
    KcoordProcess(data).start().stop()
    (data / "kcoord.meta.json").write_text('{"offsets_partit')
    result = _serve_once(data)
    assert result.returncode == 2
    assert "kcoord.meta.json is damaged" in result.stderr


def test_sighup_stops_gracefully(tmp_path: Path) -> None:
    """As SIGTERM (the JVM runs its shutdown hooks on SIGHUP, so a Kafka broker stops cleanly): a
    closed terminal must not kill the server mid-request."""
    server = KcoordProcess(tmp_path / "data").start()
    assert server.proc is not None
    client = RawClient(server.port)
    assert client.call(commit_request("hup", {("t", 0): 3}), 8).topics[0].partitions[0].error_code == 0
    client.close()
    server.proc.send_signal(signal.SIGHUP)
    assert server.proc.wait(30) == 0
    assert "signal received: stopping" in server.log_since_start() and "kcoord stopped" in server.log_since_start()


def test_a_second_server_on_the_same_data_directory_is_refused(tmp_path: Path) -> None:
    """Two servers on one directory overwrite each other's logs (a fault campaign lost one's
    acknowledged commits): the second exits 2, the first keeps serving, and the lock goes with the
    process that held it, kill -9 included."""
    first = KcoordProcess(tmp_path / "data").start()
    second = KcoordProcess(tmp_path / "data")
    try:
        assert first.proc is not None
        client = RawClient(first.port)
        assert client.call(commit_request("locked", {("t", 0): 5}), 8).topics[0].partitions[0].error_code == 0
        result = _serve_once(tmp_path / "data")
        assert result.returncode == 2, result.stderr
        assert f"in use by another process (pid {first.proc.pid})" in result.stderr
        assert "Traceback" not in result.stderr
        assert client.call(commit_request("locked", {("t", 0): 6}), 8).topics[0].partitions[0].error_code == 0
        client.close()
        first.kill()
        second.start()
        reader = RawClient(second.port)
        assert reader.call(fetch_request("locked", {"t": [0]}), 7).topics[0].partitions[0].committed_offset == 6
        reader.close()
        assert second.stop() == 0
    finally:
        for server in (first, second):
            if server.proc is not None and server.proc.poll() is None:
                server.kill()


def test_a_data_directory_that_is_a_file_is_named_as_such(tmp_path: Path) -> None:
    """An operator's slip (``--data-dir`` naming a file, or a path under one) gets a message saying
    what is wrong with the flag, not mkdir's bare "File exists", and exit 2; the file is untouched."""
    (tmp_path / "afile").write_bytes(b"keep me")
    for data_dir in (tmp_path / "afile", tmp_path / "afile" / "data"):
        result = _serve_once(data_dir)
        assert result.returncode == 2, result.stderr
        assert f"data directory {data_dir} (--data-dir / KCOORD_DATA_DIR) is a file" in result.stderr
        assert "Traceback" not in result.stderr
    assert (tmp_path / "afile").read_bytes() == b"keep me"


def test_a_data_directory_that_cannot_be_created_says_why(tmp_path: Path) -> None:
    """Any other failure to create it (here a name longer than the file system allows, which even
    root cannot create) is named with the flag and the system's reason."""
    data_dir = tmp_path / ("d" * 300)
    result = _serve_once(data_dir)
    assert result.returncode == 2, result.stderr
    assert f"cannot create the data directory {data_dir} (--data-dir / KCOORD_DATA_DIR): File name too long" \
        in result.stderr
    assert "Traceback" not in result.stderr


def test_a_server_does_not_start_while_a_reader_holds_its_directory(tmp_path: Path) -> None:
    """The pipeline holds a data directory's lock shared while it reads it (storage.dirlock
    share_directory): a server started meanwhile exits 2 rather than rewrite segments under it, and
    names no pid, as the pid the lock file keeps is the last server's, which has exited."""
    server = KcoordProcess(tmp_path / "data").start()
    assert server.proc is not None and server.stop() == 0
    gone = server.proc.pid
    fd = share_directory(tmp_path / "data")
    assert fd is not None
    try:
        result = _serve_once(tmp_path / "data")
        assert result.returncode == 2, result.stderr
        assert "in use by another process (it holds" in result.stderr and f"pid {gone}" not in result.stderr
    finally:
        os.close(fd)
    server.start()
    assert server.stop() == 0


def test_logs_without_their_meta_file_keep_their_partition_count(tmp_path: Path) -> None:
    """Removing the meta file (as the damaged-meta message suggests) must not let a larger partition
    count re-map every group: the logs say how many partitions the topic had."""
    data = tmp_path / "data"
    KcoordProcess(data, "--offsets-partitions", "8").start().stop()
    (data / "kcoord.meta.json").unlink()
    result = _serve_once(data, "--offsets-partitions", "12")
    assert result.returncode == 2
    assert "offsets topic of 8 partitions" in result.stderr and "Start with 8" in result.stderr
    KcoordProcess(data, "--offsets-partitions", "8").start().stop()
    assert json.loads((data / "kcoord.meta.json").read_text()) == {"offsets_partitions": 8}


def test_a_kafka_deleted_partition_directory_is_ignored(tmp_path: Path) -> None:
    """Kafka renames a deleted partition's directory ``<topic>-<n>.<id>-delete``; one copied in with
    a partition's logs made the start-up's partition count check die with a traceback."""
    data = tmp_path / "data"
    (data / "__consumer_offsets-3.8f1e2d-delete").mkdir(parents=True)
    server = KcoordProcess(data).start()
    assert server.stop() == 0
    assert "Traceback" not in server.log()


class _AckTracker(threading.Thread):
    """One connection committing increasing offsets to its own partition of a shared group, keeping
    ``window`` requests in flight; remembers the highest offset acknowledged (replies come back in
    request order, so each one answers the oldest offset still outstanding)."""

    def __init__(self, port: int, partition: int, window: int = 16) -> None:
        super().__init__(daemon=True)
        self.client = RawClient(port, timeout=30)
        self.partition = partition
        self.window = window
        self.acked = -1

    def run(self) -> None:
        outstanding: deque[int] = deque()
        offset = 0

        def send_next() -> None:
            nonlocal offset
            offset += 1
            outstanding.append(offset)
            self.client.send(commit_request("busy", {("t", self.partition): offset}), 8)

        try:
            for _ in range(self.window):
                send_next()
            while True:
                _, resp = self.client.receive(8, 8)
                answered = outstanding.popleft()
                if resp.topics[0].partitions[0].error_code == 0:
                    self.acked = answered
                send_next()
        except (ConnectionError, OSError):
            pass


def test_sigterm_under_load_stops_promptly_and_loses_nothing(kcoord: KcoordProcess, report: Report) -> None:
    assert kcoord.proc is not None
    committers = [_AckTracker(kcoord.port, p) for p in range(32)]
    for c in committers:
        c.start()
    time.sleep(2)
    signalled = time.monotonic()
    kcoord.proc.send_signal(signal.SIGTERM)
    code = kcoord.proc.wait(30)
    report.figure("SIGTERM to exit with 32 connections committing to one group", (time.monotonic() - signalled) * 1000,
                  "ms")
    assert code == 0
    for c in committers:
        c.join(10)
    assert all(c.acked > 0 for c in committers)
    kcoord.start()
    reader = RawClient(kcoord.port)
    got = reader.call(fetch_request("busy", {"t": list(range(32))}), 7)
    committed = {p.partition_index: p.committed_offset for p in got.topics[0].partitions}
    for c in committers:
        assert committed[c.partition] >= c.acked, (c.partition, committed[c.partition], c.acked)
    reader.close()


def test_sigterm_with_a_large_request_in_flight_stops_promptly(kcoord: KcoordProcess, report: Report) -> None:
    """Review finding: a request being decoded on the bulk thread at stop used to hold the stop until its
    deadline, unanswered."""
    assert kcoord.proc is not None
    client = RawClient(kcoord.port)
    _, large = client.encode(commit_request("stopping", {("t", i): i for i in range(40_000)}), 8)
    client.sock.sendall(large)
    time.sleep(0.05)
    signalled = time.monotonic()
    kcoord.proc.send_signal(signal.SIGTERM)
    assert kcoord.proc.wait(30) == 0
    report.figure("SIGTERM to exit with a 40k-partition commit in flight", (time.monotonic() - signalled) * 1000, "ms")
    assert "Traceback" not in kcoord.log()
    assert "some requests were not answered" not in kcoord.log()
    client.close()


def test_requests_sent_before_the_client_closes_are_still_served(kcoord: KcoordProcess) -> None:
    """A client may write its requests and close its side at once (kafka-python's producer does, with
    acks=0, through the gateway): as Kafka does, every complete request read before the end of the
    stream is served, even when there are more than the dispatcher starts in one pass (16), and the
    replies still go out before kcoord closes the connection."""
    for attempt in range(5):
        client = RawClient(kcoord.port)
        group = f"closing-{attempt}"
        frames = b"".join(client.encode(commit_request(group, {("t", 0): offset}), 8)[1] for offset in range(1, 81))
        client.sock.sendall(frames)
        client.sock.shutdown(socket.SHUT_WR)
        answers = [client.receive(8, 8)[1] for _ in range(80)]
        assert all(a.topics[0].partitions[0].error_code == 0 for a in answers)
        assert client.sock.recv(1) == b"", "kcoord closes the connection once every request is answered"
        client.close()
        reader = RawClient(kcoord.port)
        fetched = reader.call(fetch_request(group, {"t": [0]}), 7)
        reader.close()
        assert fetched.topics[0].partitions[0].committed_offset == 80, f"attempt {attempt}"


def test_a_client_that_reads_nothing_does_not_hold_the_stop_to_its_deadline(tmp_path: Path, report: Report) -> None:
    """A campaign's find: one connection with thousands of unread replies (its socket buffers full)
    held every stop for the whole --shutdown-timeout-ms. Connections that take nothing for a second are
    dropped; the stop is still clean (every reply was written) and exits 0."""
    server = KcoordProcess(tmp_path / "data", "--shutdown-timeout-ms", "60000").start()
    client = RawClient(server.port)
    assert client.call(commit_request("big", {("t", i): i for i in range(5000)}), 8).throttle_time_ms == 0
    _, frame = client.encode(fetch_request("big", None), 6)
    silent = socket.create_connection(("127.0.0.1", server.port))
    silent.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    silent.setblocking(False)
    with contextlib.suppress(BlockingIOError):
        for _ in range(2000):
            silent.send(frame)
    # Replies are made until the socket pushes back and kcoord holds the rest itself: the answered count
    # then stops moving (a fast build gets there in well under a second, an interpreted one later).
    answered = [-1, -1]
    for _ in range(600):
        time.sleep(0.3)
        answered.append(answered_fetches(server))
        if answered[-1] > 0 and answered[-1] == answered[-2] == answered[-3]:
            break
    else:
        pytest.fail(f"the answered fetches never settled: {answered[-5:]}")
    assert server.proc is not None
    signalled = time.monotonic()
    assert server.stop(60) == 0
    report.figure("SIGTERM to exit with a client reading nothing", (time.monotonic() - signalled) * 1000, "ms")
    # Dropped for taking nothing, not held to the deadline: which of the two ended the wait is logged.
    assert "connection(s) with" in server.log() and "their peers took none for 1 s" in server.log(), server.log()
    silent.close()
    client.close()


def test_a_stop_that_abandons_work_exits_1(tmp_path: Path) -> None:
    """A campaign's find: a stop whose deadline passed with a write still in its sync (the sync helper
    frozen: a hung volume looks the same) exited 0, as a clean one; a supervisor could not tell them
    apart. Kafka halts with 1 when its shutdown fails."""
    server = KcoordProcess(tmp_path / "data", "--shutdown-timeout-ms", "1500").start()
    assert server.proc is not None
    helper = int(subprocess.run(["pgrep", "-P", str(server.proc.pid)], capture_output=True, text=True,
                                check=True).stdout.split()[0])
    client = RawClient(server.port, timeout=30)
    assert client.call(commit_request("g", {("t", 0): 1}), 8).topics[0].partitions[0].error_code == 0
    os.kill(helper, signal.SIGSTOP)
    try:
        held = False
        for offset in range(2, 7):
            # A cycle whose journal segment is new since the last sync goes to the writer thread, not the
            # frozen helper (a checkpoint's spare not ready yet: a busy machine); that commit is answered.
            _, frame = client.encode(commit_request("g", {("t", 0): offset}), 8)
            client.sock.sendall(frame)
            client.sock.settimeout(1.0)
            try:
                client.read_frame()
            except TimeoutError:
                held = True
                break
        assert held, "every commit was synced without the helper"
        assert server.stop(30) == 1
        assert "some requests were not answered by the deadline" in server.log()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(helper, signal.SIGCONT)
        client.close()
