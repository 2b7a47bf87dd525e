"""Paced runs through bench/pacer.c, a C open-loop load generator, where a C compiler is present.

Why: at the paced scenario's rates the asyncio generator's own p99 (what it measures for the in-memory
librdkafka mock at the same rate) was ~2 ms, several times the durable-commit p99 being measured. The
C program keeps the same rules (bench/client.py's Pacer: due times, round robin, at most D outstanding
per connection, latency from when a request was due) and only sends and times; the answers are
checked here afterwards with the same Checker: the first answer to each distinct request, and every
later answer that differs from it.
"""

import array
import asyncio
import hashlib
import heapq
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import cast

from bench.client import Checker, Load, Route, Run, Sample

SOURCE = Path(__file__).with_name("pacer.c")
NAME = "C pacer (bench/pacer.c)"
LATE_AFTER_S = 2 * 100e-6  # two of pacer.c's TICK_NS passes: what it counts as late
_ENTRY = struct.Struct("<II")


def binary() -> Path | None:
    """bench/pacer.c built with the system's C compiler (``$CC`` or cc), once per version of the source,
    in the temporary directory; None (and a line on stderr) when it cannot be built."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        print("bench: no C compiler: paced runs use the asyncio load generator", file=sys.stderr)
        return None
    source = SOURCE.read_bytes()
    out = Path(tempfile.gettempdir()) / f"kcoord-pacer-{hashlib.sha256(source).hexdigest()[:16]}"
    if not out.exists():
        tmp = out.with_name(f"{out.name}.{os.getpid()}")
        done = subprocess.run([cc, "-O2", "-o", str(tmp), str(SOURCE)], capture_output=True, text=True)
        if done.returncode != 0:
            print(f"bench: building {SOURCE.name} failed ({done.stderr.strip()[-300:]}); paced runs use the asyncio "
                  "load generator", file=sys.stderr)
            return None
        tmp.replace(out)
    return out


def _records(data: bytes) -> list[tuple[int, bytes]]:
    """(request, body) records of bodies.bin / odd.bin."""
    out, pos = [], 0
    while pos < len(data):
        slot, size = _ENTRY.unpack_from(data, pos)
        pos += _ENTRY.size
        out.append((slot, data[pos : pos + size]))
        pos += size
    return out


async def measure_routes(program: Path, routes: Sequence[Route], checker: Checker, *, inflight: int,
                         warmup: float, duration: float, server_cpu: Callable[[], float | None],
                         rate: float) -> Sample:
    """A paced run over a cluster: one C program per node, started together, each sending its node's
    groups (``Route.load``) on its own connections at its share of ``rate`` (the share of the load's
    requests it has), so the cluster as a whole is paced at ``rate`` as a server of one node is. One
    Sample: the latencies of every node, their counts summed (``requests_by_route`` keeps each node's),
    the server's CPU from the first window's start to the last one's end."""
    total = sum(len(r.load.order) for r in routes)
    marks: list[float | None] = []

    def mark() -> float | None:
        marks.append(server_cpu())
        return None

    tasks = [asyncio.ensure_future(
        measure(program, r.host, r.port, r.load, checker, connections=r.connections, inflight=inflight,
                 warmup=warmup, duration=duration, server_cpu=mark, rate=rate * len(r.load.order) / total))
        for r in routes]
    try:
        samples = await asyncio.gather(*tasks)
    except BaseException:
        # One node's pacer failed: the others are stopped, not left sending load to the cluster while
        # the harness stops it (or measures the next server)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    merged = merge(samples)
    if len(marks) == 2 * len(routes) and None not in marks:  # each window's start and end, in time order
        merged.server_cpu_s = cast(float, marks[-1]) - cast(float, marks[0])
    return merged


def merge(samples: Sequence[Sample]) -> Sample:
    """The nodes' samples as one: counts summed, ``requests_by_route`` each node's, the windows' mean
    length, and the latencies interleaved in time (each node's k-th answer taken to be k/n of its window
    in), since report.slow_bursts reads the i-th latency as ~i/rate into the window: one node's after
    the other's put requests of one node twice as close as they came, joining slow ones into queues."""
    merged = Sample(client=NAME, late_after_s=LATE_AFTER_S)
    timed = [[((k + 0.5) * one.seconds / len(one.latencies), latency) for k, latency in enumerate(one.latencies)]
             for one in samples if one.latencies]
    merged.latencies = [latency for _, latency in heapq.merge(*timed, key=lambda entry: entry[0])]
    for one in samples:
        merged.requests += one.requests
        merged.responses += one.responses
        merged.unanswered += one.unanswered
        merged.late += one.late
        merged.held += one.held
        merged.client_cpu_s += one.client_cpu_s
        merged.errors.update(one.errors)
        merged.requests_by_route.append(one.requests)
    merged.seconds = sum(one.seconds for one in samples) / len(samples)
    return merged


async def measure(program: Path, host: str, port: int, load: Load, checker: Checker, *, connections: int,
                  inflight: int, warmup: float, duration: float, server_cpu: Callable[[], float | None],
                  rate: float) -> Sample:
    """One paced run by the C program; the same Sample the asyncio generator fills."""
    sample = Sample(client=NAME, late_after_s=LATE_AFTER_S)
    run = Run(load, checker, inflight, sample)
    with tempfile.TemporaryDirectory(prefix="kcoord-pacer-") as tmp:
        ring = Path(tmp, "ring.bin")
        with ring.open("wb") as f:
            f.write(_ENTRY.pack(len(run.ring), len(load.slots)))
            for slot, frame in zip(run.slot_of, run.ring, strict=True):
                f.write(_ENTRY.pack(slot, len(frame)))
                f.write(frame)
        proc = await asyncio.create_subprocess_exec(
            str(program), host, str(port), str(connections), str(inflight), repr(rate), repr(warmup), repr(duration),
            str(ring), tmp, stdout=asyncio.subprocess.PIPE)
        assert proc.stdout is not None
        server0 = server1 = None
        result: dict[str, int] = {}
        try:
            async for raw in proc.stdout:
                line = raw.decode().strip()
                if line == "window-start":
                    server0 = server_cpu()
                elif line.startswith("window-end"):
                    server1 = server_cpu()
                    _, seconds, cpu = line.split()
                    sample.seconds, sample.client_cpu_s = float(seconds), float(cpu)
                elif line.startswith("{"):
                    result = json.loads(line)
            await proc.wait()
        finally:
            if proc.returncode is None:  # cancelled (a sibling node's pacer failed): it sends no more
                proc.kill()
                await asyncio.shield(proc.wait())
        if proc.returncode != 0 or not result:
            raise RuntimeError(f"{program} for {host}:{port} failed (exit status {proc.returncode})")
        latencies = array.array("d")
        latencies.frombytes(Path(tmp, "latencies.f64").read_bytes())
        firsts = _records(Path(tmp, "bodies.bin").read_bytes())
        odd = _records(Path(tmp, "odd.bin").read_bytes())
    sample.latencies = latencies.tolist()
    sample.requests = result["responses"]  # in the measured window
    sample.responses = result["answered"]  # in all phases
    sample.unanswered = result["unanswered"]
    sample.late = result["late"]
    sample.held = result["held"]
    if server0 is not None and server1 is not None:
        sample.server_cpu_s = server1 - server0
    for slot, body in firsts + odd:
        run.check(slot, body)
    unchecked = result["odd"] - len(odd)
    if result["out_of_order"]:
        sample.errors["correlation id out of order"] += result["out_of_order"]
    if result["lost_connections"]:
        sample.errors["connection lost"] += result["lost_connections"]
    if unchecked > 0:
        sample.errors["differing answers not checked (over the pacer's limit)"] += unchecked
    return sample
