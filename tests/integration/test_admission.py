"""Connection caps of a real kcoord process: ``--max-connections``, and the descriptors kept for the
logs under the open-files limit (coordinator.admission). Refused connections are closed at once,
the ones already open keep being served, and every partition can still be written."""

import socket
import time
from collections.abc import Iterator
from pathlib import Path

from protocol.partitioning import partition_for
from tests.integration.test_metrics import get, scrape, value
from tests.kcoord_process import KcoordProcess
from tests.rawclient import RawClient, commit_request, fetch_request

PARTITIONS = 10


def closed_at_once(port: int, wait: float = 5.0) -> bool:
    """Whether the server closes a new connection before it sends anything (it is accepted by the
    kernel either way: the listen backlog), or keeps it open for ``wait`` seconds."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.settimeout(wait)
        try:
            return sock.recv(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False


def answers(client: RawClient, group: str, offset: int) -> bool:
    response = client.call(commit_request(group, {("t", 0): offset}), 8)
    return bool(response.topics[0].partitions[0].error_code == 0)


def group_per_partition() -> Iterator[str]:
    found: dict[int, str] = {}
    n = 0
    while len(found) < PARTITIONS:
        found.setdefault(partition_for(f"g{n}", PARTITIONS), f"g{n}")
        n += 1
    return iter(found.values())


def test_max_connections_closes_the_newcomers_and_serves_the_rest(tmp_path: Path) -> None:
    server = KcoordProcess(tmp_path / "data", "--max-connections", "3").start()
    try:
        clients = [RawClient(server.port) for _ in range(3)]
        assert all(answers(c, f"held-{i}", 7) for i, c in enumerate(clients))
        assert closed_at_once(server.port)
        assert closed_at_once(server.port)
        assert all(answers(c, f"held-{i}", 8) for i, c in enumerate(clients))  # still served
        clients.pop().close()
        for _ in range(100):  # the server sees the close on its next loop pass
            if not closed_at_once(server.port):
                break
        else:
            raise AssertionError("a slot freed by a closed connection was never taken")
        samples = scrape(server)
        assert value(samples, "kcoord_connections_aborted_total", reason="max_connections") >= 2
        log = server.log_since_start()
        assert log.count("closing a new connection at once: 3 client connections are open "
                         "(--max-connections 3)") == 1  # once, then at most once a minute
        for c in clients:
            c.close()
    finally:
        server.stop()


def test_a_connection_flood_leaves_descriptors_for_every_partition(tmp_path: Path) -> None:
    """At a low open-files limit, 300 idle connections would take every descriptor, and the first
    commit to each partition (which opens its active segment) would fail and make it read-only."""
    server = KcoordProcess(tmp_path / "data", "--offsets-partitions", str(PARTITIONS), open_files=256).start()
    flood: list[socket.socket] = []
    try:
        committer = RawClient(server.port)
        for _ in range(300):
            flood.append(socket.create_connection(("127.0.0.1", server.port), timeout=10))
        time.sleep(2)  # the server takes them all in its next few loop passes
        refused = 0
        for sock in flood:
            sock.setblocking(False)  # a socket with a timeout would wait for data before reading
            try:
                refused += sock.recv(1) == b""
            except BlockingIOError:
                pass  # still open: accepted
            except ConnectionResetError:
                refused += 1
        assert refused > 0
        groups = list(group_per_partition())
        for i, group in enumerate(groups):
            assert answers(committer, group, 100 + i), group
        fetched = committer.call(fetch_request(groups[-1], {"t": [0]}), 6)
        assert fetched.topics[0].partitions[0].committed_offset == 100 + PARTITIONS - 1
        assert get(server.metrics_url + "/readyz")[0] == 200
        samples = scrape(server)
        assert value(samples, "kcoord_connections_aborted_total", reason="file_descriptors") == refused
        log = server.log_since_start()
        assert "closing a new connection at once: its file descriptor" in log
        assert " ERROR " not in log and "Too many open files" not in log
        committer.close()
    finally:
        for sock in flood:
            sock.close()
        server.stop()


def test_a_metrics_port_flood_neither_starves_the_logs_nor_the_probes(tmp_path: Path) -> None:
    """300 idle connections to the metrics listener took the descriptors segment rolls needed (a fault
    campaign: 141 ERROR lines and NOT_COORDINATOR for most commits at nofile 200). The listener keeps
    at most 32 open, closing the oldest, so commits that roll segments keep succeeding and the health
    probes keep answering."""
    server = KcoordProcess(tmp_path / "data", "--offsets-partitions", str(PARTITIONS), "--segment-bytes", "2048",
                           open_files=256).start()
    host, port = server.metrics_url.removeprefix("http://").split(":")
    flood = [socket.create_connection((host, int(port)), timeout=10) for _ in range(300)]
    try:
        time.sleep(2)  # the listener takes them all meanwhile: uncapped, every descriptor
        committer = RawClient(server.port)
        groups = list(group_per_partition())
        for offset in range(40):  # ~20 commits fill a 2 KiB segment: every partition rolls
            for group in groups:
                assert answers(committer, group, offset), (group, offset)
        assert get(server.metrics_url + "/healthz")[0] == 200
        assert get(server.metrics_url + "/readyz")[0] == 200
        log = server.log_since_start()
        assert " ERROR " not in log and "Too many open files" not in log
        assert "metrics listener: 32 connections open; closing the oldest" in log
        committer.close()
    finally:
        for sock in flood:
            sock.close()
        server.stop()
