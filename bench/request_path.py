"""CPU per request of kcoord's own request path, without sockets, clients or a second process.

The harness measures kcoord end to end, but on a shared 2-core machine its req/s move by +-20% between
rounds, which hides changes of a few microseconds per request. This drives the real ``Server``,
``Connection`` and ``Runtime`` (real files, real fsyncs, the real writer thread) in one process and
replaces only the socket: frames are fed to ``data_received`` as a pipelining client's reads would
arrive, and replies are collected from ``write``. It reports the CPU per request (all threads, and
the sync helper process's) and the event loop's share, for the harness's request shapes (built with kafka-python, as
the harness builds them). Every reply is counted and its error codes checked.

    python -m bench.request_path [--scenarios fetch-1,commit-1,fetch-100,commit-100] [--requests N] [--runs N]
                                 [--sync-helper on|off]

Use it to compare two trees (run it in each, alternately); the harness stays the reference for
throughput and latency against the peers.
"""

import argparse
import asyncio
import socket
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kafka.protocol.consumer.group import OffsetCommitResponse, OffsetFetchResponse

from bench.client import cpu_seconds
from bench.scenarios import SCENARIOS, templates
from bench.wire import COMMIT_VERSION, HIGHEST_FETCH_VERSION, commit_frame, fetch_frame
from coordinator.cli import tune_interpreter
from coordinator.config import Config
from coordinator.connection import Connection
from coordinator.runtime import Runtime
from coordinator.server import Server

_SIZE = struct.Struct(">i")


class _Transport:
    """Just what Connection uses of an asyncio transport; collects what it writes."""

    def __init__(self, written: asyncio.Event) -> None:
        self.chunks: list[bytes] = []
        self._written = written
        self._socket = socket.socket()  # a descriptor for the admission check (coordinator.admission)

    def write(self, data: bytes) -> None:
        self.chunks.append(data)
        self._written.set()

    def get_extra_info(self, name: str) -> Any:
        return {"peername": ("127.0.0.1", 1), "socket": self._socket}.get(name)

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False

    def set_write_buffer_limits(self, high: int) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


def _replies(chunks: list[bytes]) -> list[bytes]:
    data = b"".join(chunks)
    out, pos = [], 0
    while pos < len(data):
        (size,) = _SIZE.unpack_from(data, pos)
        out.append(data[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return out


def _errors(kind: str, reply: bytes) -> int:
    """Partitions answered with an error (the body after the correlation id and tag byte)."""
    if kind == "commit":
        resp = OffsetCommitResponse[COMMIT_VERSION].decode(reply[5:])
        return sum(p.error_code != 0 for t in resp.topics for p in t.partitions)
    resp = OffsetFetchResponse[HIGHEST_FETCH_VERSION].decode(reply[5:])
    return sum(g.error_code != 0 or any(p.error_code != 0 for t in g.topics for p in t.partitions)
               for g in resp.groups)


async def _answers(pair: tuple[Connection, _Transport], data: bytes, count: int) -> list[bytes]:
    """Feeds ``data`` (``count`` requests) and waits for all their replies."""
    conn, transport = pair
    transport.chunks.clear()
    conn.data_received(data)
    replies: list[bytes] = []
    while len(replies) < count:
        await asyncio.sleep(0.001)
        replies += _replies(transport.chunks)
        transport.chunks.clear()
    return replies


def _helper_cpu(runtime: Runtime) -> float:
    """CPU seconds of the sync helper process so far (storage.synchelper; 0 without one). Its fsyncs'
    kernel time is charged to it, as it was to the writer thread before."""
    helper = runtime.flusher.helper
    if helper is None or helper.pid is None:
        return 0.0
    try:
        return cpu_seconds(f"/proc/{helper.pid}/stat")
    except OSError:
        return 0.0


async def _run(kind: str, frames: list[bytes], connections: int, inflight: int, requests: int,
               data_dir: Path, sync_helper: bool) -> dict[str, float]:
    runtime = Runtime(Config(data_dir=data_dir, sync_helper=sync_helper))
    server = Server(runtime)
    server.loop = asyncio.get_running_loop()
    runtime.start()
    await runtime.wait_loaded()
    conns: list[tuple[Connection, _Transport]] = []
    written = asyncio.Event()
    for _ in range(connections):
        conn, transport = Connection(server), _Transport(written)
        conn.connection_made(transport)  # type: ignore[arg-type]
        conns.append((conn, transport))
    # Warm up: every distinct request once, so groups exist and fetches read offsets.
    await _answers(conns[0], b"".join(frames), len(frames))
    framed = frames  # bench.wire's frames carry their size prefix
    sent = [0] * connections
    answered = [0] * connections
    per_conn = requests // connections
    cpu0, wall0 = time.process_time() + _helper_cpu(runtime), time.perf_counter()
    for c, (conn, _) in enumerate(conns):  # every connection starts with ``inflight`` requests outstanding
        burst = [framed[(c * 7919 + k) % len(framed)] for k in range(inflight)]
        sent[c] = inflight
        conn.data_received(b"".join(burst))
    loop_cpu0 = time.thread_time()
    while sum(answered) < per_conn * connections:
        await written.wait()  # the loop sleeps while nothing is answered (a sync is running)
        written.clear()
        for c, (conn, transport) in enumerate(conns):
            n = len(_replies(transport.chunks)) if transport.chunks else 0
            if n:
                answered[c] += n
                transport.chunks.clear()
                more = min(n, per_conn - sent[c])
                if more > 0:  # a client answers a read with one write of as many new requests
                    conn.data_received(b"".join(framed[(sent[c] + k) % len(framed)] for k in range(more)))
                    sent[c] += more
    loop_cpu = time.thread_time() - loop_cpu0
    cpu, wall = time.process_time() + _helper_cpu(runtime) - cpu0, time.perf_counter() - wall0
    done = sum(answered)
    # One last pass through every distinct request, checked.
    errors = sum(_errors(kind, r) for r in await _answers(conns[0], b"".join(framed), len(framed)))
    await runtime.stop(asyncio.get_running_loop().time() + 10)
    return {"requests": done, "us_per_req": cpu / done * 1e6, "loop_us_per_req": loop_cpu / done * 1e6,
            "req_per_s": done / wall, "errors": errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default="fetch-1,commit-1,fetch-100,commit-100")
    parser.add_argument("--requests", type=int, default=40_000, help="per scenario (100-partition ones: /20)")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--inflight", type=int, default=16)
    parser.add_argument("--groups", type=int, default=64)
    parser.add_argument("--sync-helper", choices=("on", "off"), default="on",
                        help="flush cycles synced by the helper process (kcoord's default) or the writer thread")
    parser.add_argument("--runs", type=int, default=3,
                        help="runs per scenario; the row is the run with the least CPU per request (noise on a "
                             "shared machine only ever adds CPU)")
    args = parser.parse_args()
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    tune_interpreter()  # the server's GIL switch interval and GC thresholds
    print(f"{'scenario':<12}{'requests':>9}{'req/s':>9}{'us/req':>8}{'loop us/req':>12}{'errors':>7}")
    for name in args.scenarios.split(","):
        s = SCENARIOS[name]
        if s.kind not in ("commit", "fetch"):
            sys.exit(f"{name}: only the uniform commit and fetch scenarios are supported")
        ts = templates(s, args.groups)
        frames = [commit_frame(t) if s.kind == "commit" else fetch_frame(t, HIGHEST_FETCH_VERSION) for t in ts]
        requests = args.requests // (20 if s.partitions > 1 else 1)
        results = []
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="kcoord-request-path-") as tmp:
                results.append(asyncio.run(_run(s.kind, frames, args.connections, args.inflight, requests,
                                                Path(tmp), args.sync_helper == "on")))
        r = min(results, key=lambda x: x["us_per_req"])
        r["errors"] = sum(x["errors"] for x in results)
        print(f"{name:<12}{r['requests']:>9,}{r['req_per_s']:>9,.0f}{r['us_per_req']:>8.1f}"
              f"{r['loop_us_per_req']:>12.1f}{r['errors']:>7}")


if __name__ == "__main__":
    main()
