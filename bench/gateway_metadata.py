"""A Metadata burst in gateway mode: N clients ask for every topic of a large cluster at once, straight to
the upstream and through kcoord, same run, while a probe in its own process asks OffsetFetch every 5 ms.
It reports when every client had its answer and how long the probe's requests waited: what a
coordinator's members see while many clients start together (a fault campaign's measurement of
kcoord rewriting each answer whole: 4-11 s behind a burst, sessions expired).

    python -m bench.gateway_metadata [--topics 6000] [--clients 500] [--rounds 3]

The upstream is librdkafka's mock cluster (3 brokers, in the confluent-kafka wheel), given the topics
first (4 partitions each, 3 replicas: 6,000 make an all-topics answer of ~1.1 MB). Each client connects
and asks for no topic first (through kcoord that opens its upstream link), one at a time; then all ask
Metadata v9 (flexible) for every topic (a null list) at once. The probe sends OffsetFetch v5 on its own
connection to the same server (the mock answers it as a coordinator too).
Rounds alternate direct and through kcoord; each line is one round.
"""

import argparse
import asyncio
import contextlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from bench.gateway_bench import start_kcoord, start_upstream
from bench.join_storm import _frame, _read_frame
from bench.wire import recv_frame


def create_topics(bootstrap: str, topics: int) -> None:
    """The mock cluster creates topics (4 partitions each) that a Metadata request names with
    auto-creation allowed; its CreateTopics did not answer here."""
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        named = [MetadataRequest.MetadataRequestTopic(name=f"topic-{i:05d}") for i in range(topics)]
        sock.sendall(_frame(MetadataRequest(topics=named, allow_auto_topic_creation=True), 4, 1))
        answer = MetadataResponse.decode(recv_frame(sock)[4:], version=4)
    if len(answer.topics) != topics or any(t.error_code for t in answer.topics):
        raise SystemExit(f"the mock cluster did not create {topics} topics")


async def _burst(host: str, port: int, clients: int) -> tuple[float, int, int]:
    """Seconds from the first request sent to the last answer, the answers' mean size and the topics in one."""
    def request(topics: list[Any] | None, correlation: int) -> bytes:
        return _frame(MetadataRequest(topics=topics, allow_auto_topic_creation=False,
                                      include_cluster_authorized_operations=False,
                                      include_topic_authorized_operations=False), 9, correlation)

    # Connected one at a time, each with a Metadata request for no topic (through kcoord that opens the
    # connection's upstream link), as clients are before they ask for topics: the burst is of requests,
    # not of connections (200 connects at once overflowed the mock's listen backlog, whatever asked).
    streams = []
    for _ in range(clients):
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(request([], 0))
        await _read_frame(reader)
        streams.append((reader, writer))
    frame = request(None, 1)

    async def ask(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
        writer.write(frame)
        answer = await _read_frame(reader)
        writer.close()
        return answer

    started = time.perf_counter()
    answers = await asyncio.gather(*(ask(r, w) for r, w in streams))
    took = time.perf_counter() - started
    topics = len(MetadataResponse.decode(answers[0][5:], version=9).topics)  # after correlation id, tagged fields
    return took, int(statistics.mean(map(len, answers))), topics


@dataclass
class BurstResult:
    server: str
    clients: int
    topics: int  # in one answer
    answer_bytes: int  # mean
    after_s: float  # from the first request of the burst to the last answer
    probe_p50_ms: float
    probe_p99_ms: float
    probe_max_ms: float

    def line(self) -> str:
        return (f"{self.server:<8} {self.clients:>7} {self.topics:>6} {self.answer_bytes / 1024:>7.0f}KB "
                f"{self.after_s:>7.2f}s {self.clients / self.after_s:>9.0f}/s {self.probe_p50_ms:>8.1f}ms "
                f"{self.probe_p99_ms:>7.1f}ms {self.probe_max_ms:>7.0f}ms")


def burst(server: str, bootstrap: str, clients: int) -> BurstResult:
    """One burst of ``clients`` all-topics requests to ``bootstrap``, with the probe asking there too."""
    host, _, port = bootstrap.rpartition(":")
    probe = subprocess.Popen([sys.executable, "-m", "bench.join_storm", "--probe", bootstrap],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    took, size, topics = asyncio.run(_burst(host, int(port), clients))
    time.sleep(0.5)
    out, _ = probe.communicate("", timeout=120)
    latencies = sorted(float(line) * 1000 for line in out.split())
    return BurstResult(server, clients, topics, size, took, statistics.median(latencies),
                       latencies[int(len(latencies) * 0.99)], latencies[-1])


@contextlib.contextmanager
def servers(topics: int, tmp: Path) -> Iterator[tuple[str, str]]:
    """The mock cluster given ``topics`` topics, and kcoord in front of it: (a broker's address, kcoord's).
    kcoord's log is ``tmp/kcoord.log``."""
    upstream, upstream_bootstrap = start_upstream("mock", tmp)
    kcoord = None
    try:
        create_topics(upstream_bootstrap, topics)
        kcoord, kcoord_bootstrap = start_kcoord(upstream_bootstrap, tmp)
        yield upstream_bootstrap.split(",")[0], kcoord_bootstrap
    finally:
        if kcoord is not None:
            kcoord.terminate()
            kcoord.wait(30)
        assert upstream.stdin is not None
        upstream.stdin.close()
        upstream.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=6000)
    parser.add_argument("--clients", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, servers(args.topics, Path(tmp)) as (direct, kcoord):
        print(f"{'server':<8} {'clients':>7} {'topics':>6} {'answer':>9} {'after':>8} {'answers':>11} "
              f"{'probe p50':>10} {'p99':>9} {'max':>9}")
        for _ in range(args.rounds):
            for name, bootstrap in (("direct", direct), ("kcoord", kcoord)):
                print(burst(name, bootstrap, args.clients).line(), flush=True)


if __name__ == "__main__":
    main()
