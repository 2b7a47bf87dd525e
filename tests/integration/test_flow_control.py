"""Clients that pipeline requests and never read their replies must not make kcoord buffer without bound
or starve other clients: the server stops starting their requests and stops reading from them, and
shares the event loop round robin. A bystander's latency and the server's memory are reported."""

import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

from kafka.protocol.metadata import MetadataRequest

from tests.conftest import Report
from tests.integration.load import Bystander
from tests.integration.test_metrics import scrape
from tests.kcoord_process import REPO, KcoordProcess
from tests.rawclient import RawClient, commit_request, fetch_request

NON_READERS = 20


def memory_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field}")


def flood(port: int, frame: bytes, stop: threading.Event, sent: list[int]) -> None:
    """Pipelines ``frame`` as fast as the server takes it, never reading a reply."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setblocking(False)
        burst = frame * 64
        total = 0
        while not stop.is_set():
            try:
                total += sock.send(burst)
            except BlockingIOError:
                time.sleep(0.005)  # the server stopped reading from us: our send buffer is full
        sent.append(total)


def flood_from_stdin() -> None:
    """The flooders' own process (``python -m tests.integration.test_flow_control PORT``): one thread per
    hex frame read from stdin until a blank line; they stop at the next line; prints the bytes sent.
    Kept out of the test process so the bystander's measured latency is not its own GIL contention."""
    port = int(sys.argv[1])
    frames = [bytes.fromhex(line) for line in iter(sys.stdin.readline, "\n")]
    stop = threading.Event()
    sent: list[int] = []
    threads = [threading.Thread(target=flood, args=(port, f, stop, sent), daemon=True) for f in frames]
    for t in threads:
        t.start()
    print("started", flush=True)
    sys.stdin.readline()
    stop.set()
    for t in threads:
        t.join(30)
    print(sum(sent), flush=True)


def test_clients_that_never_read_do_not_starve_others_or_grow_memory(kcoord: KcoordProcess, report: Report) -> None:
    assert kcoord.proc is not None
    pid = kcoord.proc.pid
    encoder = RawClient(kcoord.port)
    frames = [encoder.encode(commit_request(f"flood-{i}", {("t", 0): i}), 8)[1] if i % 2 else
              encoder.encode(MetadataRequest(topics=None), 4)[1] for i in range(NON_READERS)]
    encoder.close()
    rss_before = memory_kib(pid, "VmRSS")
    flooders = subprocess.Popen([sys.executable, "-m", "tests.integration.test_flow_control", str(kcoord.port)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert flooders.stdin is not None and flooders.stdout is not None
    with Bystander(kcoord.port) as bystander:
        flooders.stdin.write("".join(f.hex() + "\n" for f in frames) + "\n")
        flooders.stdin.flush()
        assert flooders.stdout.readline() == "started\n"
        time.sleep(5)
        fresh_started = time.perf_counter()
        fresh = RawClient(kcoord.port)  # a new client gets its answer while the flood goes on
        answer = fresh.call(MetadataRequest(topics=None), 4)
        fresh_ms = (time.perf_counter() - fresh_started) * 1000
        fresh.close()
        rss_during = memory_kib(pid, "VmRSS")
        flooders.stdin.write("stop\n")
        flooders.stdin.flush()
        sent = [int(flooders.stdout.readline())]
        flooders.wait(30)
    time.sleep(1)
    rss_after = memory_kib(pid, "VmRSS")
    peak = memory_kib(pid, "VmHWM")
    assert answer.topics[0].name == "__consumer_offsets"
    assert not bystander.errors
    assert sum(sent) > 0
    report.figure(f"bystander p99 commit latency with {NON_READERS} non-readers",
                  bystander.percentile_ms(0.99, commits_only=True), "ms")
    report.figure(f"bystander p99 commit+fetch round trip with {NON_READERS} non-readers",
                  bystander.percentile_ms(0.99), "ms")
    report.figure(f"bystander worst round trip with {NON_READERS} non-readers", bystander.worst_ms(), "ms")
    report.figure("a new connection's first Metadata answer during the flood", fresh_ms, "ms")
    report.figure("server RSS before / during / after the flood",
                  rss_before / 1024, f"MiB / {rss_during / 1024:.1f} MiB / {rss_after / 1024:.1f} MiB")
    report.figure("server peak RSS (VmHWM)", peak / 1024, "MiB")
    report.figure("bytes the non-readers got the server to take", sum(sent) / 1e6, "MB")
    # Memory is bounded per connection (read backlog, in-flight replies, send buffer): 20 connections
    # may hold a few MiB each at most; unbounded, this flood grew the server by hundreds of MiB.
    assert rss_during - rss_before < 64 * 1024, f"RSS grew {(rss_during - rss_before) / 1024:.0f} MiB"
    with socket.create_connection(("127.0.0.1", kcoord.port), timeout=5):
        pass  # still accepting


def test_frames_as_large_as_the_memory_budget_wait_their_turn(tmp_path: Path, report: Report) -> None:
    """--max-buffered-bytes equal to --max-frame-bytes: two clients each send a frame that needs the
    whole budget. One is read while the other waits; both are answered (no deadlock)."""
    from tests.integration.test_stalls import read_frame

    limit = 1_000_000
    server = KcoordProcess(tmp_path / "data", "--max-frame-bytes", str(limit), "--max-buffered-bytes",
                           str(limit + 4), "--log-level", "DEBUG").start()
    try:
        encoder = RawClient(server.port)
        frames = []
        for g in ("budget-a", "budget-b"):
            n = 40_000
            _, frame = encoder.encode(commit_request(g, {("t", i): i for i in range(n)}), 8)
            frames.append(frame)
        encoder.close()
        assert all(limit * 0.6 < len(f) <= limit for f in frames), [len(f) for f in frames]
        socks = [socket.create_connection(("127.0.0.1", server.port), timeout=60) for _ in frames]
        for sock, frame in zip(socks, frames, strict=True):
            sock.sendall(frame[: len(frame) // 2])  # both frames have started: one holds the budget
        time.sleep(0.2)
        for sock, frame in zip(socks, frames, strict=True):
            threading.Thread(target=sock.sendall, args=(frame[len(frame) // 2:],), daemon=True).start()
        answers = [read_frame(sock) for sock in socks]
        assert all(len(a) > 40_000 * 6 for a in answers)
        for sock in socks:
            sock.close()
        assert "buffered-bytes budget full" in server.log()  # one of them did wait
    finally:
        assert server.stop() == 0


def test_an_oversized_frame_pipelined_behind_good_ones_closes_only_its_connection(kcoord: KcoordProcess) -> None:
    """Review finding: a bad size reached only after frames before it were taken used to escape the
    dispatcher and write passes, leaving other connections unanswered."""
    from tests.integration.test_stalls import read_frame

    encoder = RawClient(kcoord.port)
    good = b"".join(encoder.encode(commit_request("pipelined", {("t", 0): i}), 8)[1] for i in range(16))
    encoder.close()
    with Bystander(kcoord.port) as bystander:
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", kcoord.port), timeout=10) as bad:
                bad.sendall(good + struct.pack(">i", 100 * 1024 * 1024 + 1))
                answered = 0
                try:
                    while True:
                        read_frame(bad)
                        answered += 1
                except (ConnectionError, OSError):
                    pass
                assert answered <= 16
        time.sleep(0.5)
    assert not bystander.errors and len(bystander.latencies_ms) > 10
    assert "frame size 104857601 outside" in kcoord.log()
    assert "Traceback" not in kcoord.log()


def test_declaring_huge_frames_without_sending_them_does_not_block_other_clients(tmp_path: Path) -> None:
    """Review finding: 8 bytes (two 100 MiB size prefixes) used to reserve the whole budget, and other
    connections stopped being read."""
    server = KcoordProcess(tmp_path / "data").start()
    try:
        holders = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(3)]
        for h in holders:
            h.sendall(struct.pack(">i", 100 * 1024 * 1024 - 8))  # a frame that never comes
        time.sleep(0.2)
        with Bystander(server.port) as bystander:
            time.sleep(1.5)
        assert not bystander.errors and len(bystander.latencies_ms) > 20
        for h in holders:
            h.close()
    finally:
        assert server.stop() == 0


def test_a_frame_as_large_as_the_budget_from_a_lone_client_is_read(tmp_path: Path) -> None:
    """Review finding: with the budget equal to the frame limit a lone client could stall itself."""
    from tests.integration.test_stalls import read_frame

    limit = 600_000
    server = KcoordProcess(tmp_path / "data", "--max-frame-bytes", str(limit), "--max-buffered-bytes",
                           str(limit + 4)).start()
    try:
        encoder = RawClient(server.port)
        _, small = encoder.encode(commit_request("lone", {("t", 0): 1}), 8)
        _, large = encoder.encode(commit_request("lone", {("t", i): i for i in range(25_000)}), 8)
        encoder.close()
        assert limit // 2 < len(large) - 4 <= limit
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            sock.sendall(small + large[:4])
            time.sleep(0.2)
            sock.sendall(large[4:])
            assert len(read_frame(sock)) < 100 and len(read_frame(sock)) > 25_000 * 6
    finally:
        assert server.stop() == 0


if __name__ == "__main__":
    flood_from_stdin()


def answered_fetches(server: KcoordProcess) -> int:
    """OffsetFetch requests the server has answered (replies made, sent or not), from its metrics."""
    return int(sum(n for (name, labels), n in scrape(server).items()
                   if name == "kcoord_requests_total" and ("api", "OffsetFetch") in labels))


def test_a_client_pipelining_large_fetches_without_reading_holds_one_answer(kcoord: KcoordProcess,
                                                                             report: Report) -> None:
    """A fault campaign's find: 20 pipelined fetches of a 100k-partition group from a client that never
    reads made 16 answers of ~2.6 MB at once (80-97 MiB of RSS per connection). Behind a large
    request nothing more is started until its reply is written, as a Kafka broker mutes a connection
    per request; the socket then pushes back. So the answers made stay few whatever is pipelined."""
    assert kcoord.proc is not None
    partitions = 50_000  # a ~1.3 MB answer: a large fetch (coordinator.offsets.LARGE_FETCH)
    writer = RawClient(kcoord.port, timeout=60)
    committed = writer.call(commit_request("wide", {(f"topic-{p % 50}", p): p for p in range(partitions)}), 8)
    assert all(p.error_code == 0 for t in committed.topics for p in t.partitions)
    _, fetch = writer.encode(fetch_request("wide", None), 7)
    writer.close()
    before = answered_fetches(kcoord)
    rss_before = memory_kib(kcoord.proc.pid, "VmRSS")
    pipelined = 16
    with socket.create_connection(("127.0.0.1", kcoord.port)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(fetch * pipelined)
        time.sleep(4)
        answered = answered_fetches(kcoord) - before
        grown = memory_kib(kcoord.proc.pid, "VmRSS") - rss_before
        bystander = RawClient(kcoord.port)
        assert bystander.call(commit_request("other", {("t", 0): 1}), 8).topics[0].partitions[0].error_code == 0
        bystander.close()
    report.figure(f"answers made for {pipelined} pipelined, unread large fetches", answered, "")
    report.figure("server RSS growth meanwhile", grown / 1024, "MiB")
    # the first answer, and one more per answer the socket buffers absorb (a few MB here): not all 16
    assert 1 <= answered <= pipelined // 2, answered
