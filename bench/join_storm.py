"""A join storm: N members (a socket each) send JoinGroup for one group at once, while a probe in its own
process asks OffsetFetch of another group every 5 ms. Side by side for kcoord and its peers, it reports
when every member had its answer and how long the probe's requests waited: what the rest of a
coordinator's clients see while a big group rebalances.

    python -m bench.join_storm [--members 2000] [--only kcoord,mock,tansu] [--kcoord-at HOST:PORT]

JoinGroup v3 (no KIP-394 round trip), protocol type ``consumer``, two protocols per member, generous
session and rebalance timeouts; every server's initial rebalance delay (3 s in Kafka and kcoord) is
inside "answered after". The probe sends OffsetFetch v5 (all three serve it) and times it in its own
process, so the storm's client does not delay it.
"""

import argparse
import asyncio
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafka.protocol.consumer.group import JoinGroupRequest, OffsetFetchRequest

from bench.peers import AttachedKcoord, Kcoord, MissingPeer, Mock, Peer, Tansu, tansu_binary
from bench.wire import SIZE, recv_frame
from protocol.errors import ErrorCode

_PROTOCOLS = [JoinGroupRequest.JoinGroupRequestProtocol(name=name, metadata=b"\x00\x00")
              for name in ("range", "roundrobin")]


@dataclass
class StormResult:
    peer: str
    members: int
    answered: int  # members answered without an error
    after_s: float  # from the first JoinGroup sent to the last answer
    probe_requests: int
    probe_p50_ms: float
    probe_p99_ms: float
    probe_max_ms: float


def _frame(request: Any, version: int, correlation: int) -> bytes:
    request.with_header(correlation_id=correlation, client_id="join-storm")
    return bytes(request.encode(version=version, header=True, framed=True))


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    size = SIZE.unpack(await reader.readexactly(4))[0]
    return await reader.readexactly(size)


async def _storm(host: str, port: int, members: int, group: str) -> tuple[float, int]:
    """Seconds from the first JoinGroup sent to the last answer, and how many answers had no error."""
    streams = [await asyncio.open_connection(host, port) for _ in range(members)]
    request = JoinGroupRequest(group_id=group, session_timeout_ms=60_000, rebalance_timeout_ms=60_000, member_id="",
                               protocol_type="consumer", protocols=_PROTOCOLS)
    frame = _frame(request, 3, 1)

    async def join(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(frame)
        answer = await _read_frame(reader)
        writer.close()
        error: int = struct.unpack_from(">h", answer, 8)[0]  # v3: correlation id, throttle time, error code
        return error == ErrorCode.NONE

    started = time.perf_counter()
    answers = await asyncio.gather(*(join(r, w) for r, w in streams))
    return time.perf_counter() - started, sum(answers)


def _probe(host: str, port: int) -> None:
    """The probe process: OffsetFetch every 5 ms until stdin closes, then one latency (s) per line."""
    import selectors

    sock = socket.create_connection((host, port))
    stop = selectors.DefaultSelector()
    stop.register(sys.stdin, selectors.EVENT_READ)
    latencies: list[float] = []
    correlation = 0
    while not stop.select(0.005):
        correlation += 1
        started = time.perf_counter()
        sock.sendall(_frame(OffsetFetchRequest(group_id="probe", topics=None, require_stable=False), 5,
                            correlation))
        recv_frame(sock)
        latencies.append(time.perf_counter() - started)
    print("\n".join(map(str, latencies)))


def run(peer: Peer, members: int) -> StormResult:
    probe = subprocess.Popen([sys.executable, "-m", "bench.join_storm", "--probe", f"{peer.host}:{peer.port}"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)  # the probe's first requests, before the storm
    took, ok = asyncio.run(_storm(peer.host, peer.port, members, f"storm-{members}-{time.monotonic_ns()}"))
    time.sleep(0.5)
    out, _ = probe.communicate("", timeout=60)
    latencies = sorted(float(line) for line in out.split())
    return StormResult(peer.name, members, ok, took, len(latencies), statistics.median(latencies) * 1000,
                       latencies[int(len(latencies) * 0.99)] * 1000, latencies[-1] * 1000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=2000)
    parser.add_argument("--only", default="kcoord,mock,tansu")
    parser.add_argument("--kcoord-at", help="HOST:PORT of a kcoord already running")
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        host, _, port = args.probe.rpartition(":")
        _probe(host, int(port))
        return
    print(f"{'peer':<8} {'members':>7} {'answered':>8} {'after':>8} {'probe p50':>10} {'p99':>9} {'max':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only.split(","):
            try:
                peer: Peer = (AttachedKcoord(args.kcoord_at) if args.kcoord_at else Kcoord(Path(tmp))) \
                    if name == "kcoord" else Mock() if name == "mock" else Tansu(Path(tmp), tansu_binary())
            except MissingPeer as missing:
                print(f"{name}: {missing}")
                continue
            try:
                r = run(peer, args.members)
            finally:
                problems = peer.close()
            print(f"{r.peer:<8} {r.members:>7} {r.answered:>8} {r.after_s:>7.2f}s {r.probe_p50_ms:>8.1f}ms "
                  f"{r.probe_p99_ms:>7.1f}ms {r.probe_max_ms:>7.0f}ms", flush=True)
            for problem in problems:
                print(f"  {problem}")


if __name__ == "__main__":
    main()
