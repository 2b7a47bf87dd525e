"""A client that pipelines requests and never reads its replies must not make kcoord buffer without
bound or starve other clients: the server stops reading from it."""

import socket
import time

from kafka.protocol.metadata import MetadataRequest

from tests.kcoord_process import KcoordProcess
from tests.rawclient import RawClient


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def test_a_client_that_never_reads_is_throttled(kcoord: KcoordProcess) -> None:
    assert kcoord.proc is not None
    flooder = RawClient(kcoord.port)
    _, frame = flooder.encode(MetadataRequest(topics=None), 4)  # ~1 KB answer per 30-byte request
    flooder.sock.setblocking(False)
    sent = 0
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            sent += flooder.sock.send(frame * 64)
        except BlockingIOError:
            time.sleep(0.01)  # the server stopped reading from us: our own send buffer is full
    rss_after_flood = rss_kib(kcoord.proc.pid)
    # Unthrottled, 5 s of this grows the server by hundreds of MiB (measured in review).
    assert rss_after_flood < 200 * 1024, f"server RSS {rss_after_flood} KiB after the flood"
    other = RawClient(kcoord.port)
    answer = other.call(MetadataRequest(topics=None), 4)
    assert answer.topics[0].name == "__consumer_offsets"
    other.close()
    flooder.sock.close()
    assert sent > 0
    with socket.create_connection(("127.0.0.1", kcoord.port), timeout=5):
        pass  # still accepting
