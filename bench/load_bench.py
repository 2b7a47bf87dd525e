"""How fast kcoord loads a big ``__consumer_offsets`` partition.

Writes one partition directory with N OffsetCommit records (v2 batches of ~1000 records, built with
kcoord's own storage.log / storage.batch / protocol.records, so the bytes are what kcoord itself
writes), starts a real kcoord on it (tests/kcoord_process.py) and polls with a raw OffsetFetch v6 for a
group of that partition until the answer is no longer COORDINATOR_LOAD_IN_PROGRESS (14). Then it checks
that sampled offsets are the last ones written, and reports:

* records/s from process start to the first served answer (includes interpreter start and imports),
* the pure load time kcoord logs (``partition P: loaded N records ... in X ms``) and records/s from it,
* the peak RSS of the kcoord process (VmHWM) and its increase over an idle kcoord.

Record ``i`` commits offset ``i`` for key ``i % keys``; keys are spread over groups that all hash to
the chosen partition, 100 partitions per topic. With ``--keys`` below ``--records`` later records
overwrite earlier ones, as a long-lived log does between compactions.

Run from the repository root: ``python -m bench.load_bench --help``.
"""

import argparse
import json
import os
import random
import re
import socket
import struct
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafka.protocol.consumer.group import OffsetFetchRequest, OffsetFetchResponse

from protocol.partitioning import partition_for
from protocol.records import OffsetAndMetadata, OffsetCommitRecord, OffsetKey, encode_record
from storage.batch import build_batch
from storage.log import PartitionLog
from tests.kcoord_process import KcoordProcess

OFFSETS_TOPIC = "__consumer_offsets"
PARTITIONS_PER_TOPIC = 100
FETCH_VERSION = 6
LOAD_IN_PROGRESS = 14
COMMIT_TIMESTAMP = 1_700_000_000_000
_SIZE = struct.Struct(">i")
FetchTopic = OffsetFetchRequest[FETCH_VERSION].OffsetFetchRequestTopic


@dataclass(frozen=True)
class Layout:
    """Which (group, topic, partition) key a record index writes, and what survives."""

    records: int
    keys: int
    groups: list[str]

    @property
    def keys_per_group(self) -> int:
        return -(-self.keys // len(self.groups))

    def key(self, k: int) -> OffsetKey:
        group, j = divmod(k, self.keys_per_group)
        topic, partition = divmod(j, PARTITIONS_PER_TOPIC)
        return OffsetKey(self.groups[group], f"topic-{topic}", partition)

    def final_offset(self, k: int) -> int:
        """The committed offset of key ``k`` after every record: that of the last record writing it."""
        return k + self.keys * ((self.records - 1 - k) // self.keys)


def groups_on(partition: int, partitions: int, count: int) -> list[str]:
    """``count`` group ids that Kafka's hash puts on ``partition``."""
    out: list[str] = []
    i = 0
    while len(out) < count:
        name = f"load-group-{i}"
        if partition_for(name, partitions) == partition:
            out.append(name)
        i += 1
    return out


def write_partition(directory: Path, layout: Layout, batch_records: int) -> int:
    """Writes the records as kcoord's writer does (append batches, then sync); returns the bytes."""
    plog = PartitionLog(directory)
    try:
        for base in range(0, layout.records, batch_records):
            end = min(base + batch_records, layout.records)
            entries = [
                encode_record(OffsetCommitRecord(layout.key(i % layout.keys),
                                                 OffsetAndMetadata(i, -1, "", COMMIT_TIMESTAMP)))
                for i in range(base, end)
            ]
            plog.append(build_batch(base, entries, COMMIT_TIMESTAMP), end - 1)
        plog.sync()
        return plog.size_bytes
    finally:
        plog.close()


# -- a tiny blocking OffsetFetch client -------------------------------------------------------------


def fetch(sock: socket.socket, correlation_id: int, group: str, topic: str, partitions: list[int]) -> Any:
    req = OffsetFetchRequest[FETCH_VERSION](
        group_id=group, topics=[FetchTopic(name=topic, partition_indexes=partitions)], require_stable=False
    )
    req.with_header(correlation_id=correlation_id, client_id="kcoord-load-bench")
    sock.sendall(bytes(req.encode(header=True, framed=True)))
    size = _SIZE.unpack(_recv(sock, 4))[0]
    frame = _recv(sock, size)
    got = _SIZE.unpack_from(frame)[0]
    if got != correlation_id:
        raise RuntimeError(f"correlation id {got}, expected {correlation_id}")
    return OffsetFetchResponse[FETCH_VERSION].decode(frame[5:], version=FETCH_VERSION)


def _recv(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("kcoord closed the connection")
        buf += chunk
    return buf


def connect(port: int, proc: KcoordProcess, deadline: float) -> socket.socket:
    while True:
        assert proc.proc is not None
        if proc.proc.poll() is not None:
            raise RuntimeError(f"kcoord exited with {proc.proc.returncode}:\n{proc.log()}")
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=60)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def memory_kib(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmHWM", "VmRSS"):
            out[name] = int(value.split()[0])
    return out


# -- one load ---------------------------------------------------------------------------------------


@dataclass
class LoadResult:
    listening_s: float
    served_s: float
    logged_ms: float | None
    logged_records: int | None
    logged_line: str
    peak_rss_kib: int
    rss_kib: int
    checked: int
    wrong: list[str]


def load_once(data_dir: Path, layout: Layout, partition: int, offsets_partitions: int,
              poll_interval: float, samples: int) -> LoadResult:
    kcoord = KcoordProcess(data_dir, "--offsets-partitions", str(offsets_partitions))
    started = time.perf_counter()
    kcoord.start(wait=False)
    try:
        assert kcoord.proc is not None
        sock = connect(kcoord.port, kcoord, time.monotonic() + 60)
        listening = time.perf_counter() - started
        probe = layout.key(0)
        correlation_id = 0
        deadline = time.monotonic() + 600
        with sock:
            while True:
                correlation_id += 1
                resp = fetch(sock, correlation_id, probe.group, probe.topic, [probe.partition])
                error = resp.error_code
                if error != LOAD_IN_PROGRESS:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError("partition still loading after 600 s")
                time.sleep(poll_interval)
            served = time.perf_counter() - started
            memory = memory_kib(kcoord.proc.pid)
            if error:
                raise RuntimeError(f"OffsetFetch answered error {error} after loading:\n{kcoord.log()}")
            wrong = []
            rng = random.Random(42)
            picks = [0, layout.keys - 1, *(rng.randrange(layout.keys) for _ in range(samples))]
            for k in picks:
                key = layout.key(k)
                correlation_id += 1
                resp = fetch(sock, correlation_id, key.group, key.topic, [key.partition])
                part = resp.topics[0].partitions[0]
                expected = layout.final_offset(k)
                if resp.error_code or part.error_code or part.committed_offset != expected:
                    wrong.append(f"{key}: error {resp.error_code}/{part.error_code}, "
                                 f"offset {part.committed_offset}, expected {expected}")
    finally:
        kcoord.stop()
    line, ms, records = "", None, None
    for match in re.finditer(rf"^.*partition {partition}: loaded (\d+) records.* in (\d+) ms.*$",
                             kcoord.log(), re.MULTILINE):
        line, records, ms = match.group(0), int(match.group(1)), float(match.group(2))
    return LoadResult(listening, served, ms, records, line, memory.get("VmHWM", 0), memory.get("VmRSS", 0),
                      len(picks), wrong)


def idle_peak_rss(tmp: Path, offsets_partitions: int) -> int:
    """VmHWM of a kcoord that loaded nothing: the baseline the big partition's cost is measured from."""
    kcoord = KcoordProcess(tmp / "idle-data", "--offsets-partitions", str(offsets_partitions)).start()
    try:
        assert kcoord.proc is not None
        time.sleep(0.5)
        return memory_kib(kcoord.proc.pid).get("VmHWM", 0)
    finally:
        kcoord.stop()


# -- main -------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.load_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=1_000_000, help="records in the partition (default 1,000,000)")
    p.add_argument("--keys", type=int, help="distinct (group, topic, partition) keys (default: --records, i.e. no "
                                            "overwrites)")
    p.add_argument("--groups", type=int, default=1000, help="groups the keys are spread over (default 1000)")
    p.add_argument("--partition", type=int, default=7, help="the offsets partition to fill (default 7)")
    p.add_argument("--offsets-partitions", type=int, default=50, help="kcoord --offsets-partitions (default 50)")
    p.add_argument("--batch-records", type=int, default=1000, help="records per batch (default 1000)")
    p.add_argument("--runs", type=int, default=1, help="kcoord starts on the same data (default 1)")
    p.add_argument("--poll-interval", type=float, default=0.005, help="seconds between polls (default 0.005)")
    p.add_argument("--samples", type=int, default=20, help="random keys whose offset is checked (default 20)")
    p.add_argument("--json", action="store_true", help="also print the results as one JSON line")
    args = p.parse_args(argv)
    args.keys = args.keys or args.records
    if not 1 <= args.keys <= args.records:
        p.error("--keys must be in 1..--records")
    if not 0 <= args.partition < args.offsets_partitions:
        p.error("--partition must be below --offsets-partitions")
    if args.groups < 1 or args.groups > args.keys:
        p.error("--groups must be in 1..--keys")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} before the run", flush=True)
    layout = Layout(args.records, args.keys, groups_on(args.partition, args.offsets_partitions, args.groups))
    failed = False
    runs: list[dict[str, Any]] = []
    report = {"records": args.records, "keys": args.keys, "groups": args.groups, "runs": runs}
    with tempfile.TemporaryDirectory(prefix="kcoord-load-bench-") as tmp_name:
        tmp = Path(tmp_name)
        data_dir = tmp / "data"
        t0 = time.perf_counter()
        nbytes = write_partition(data_dir / f"{OFFSETS_TOPIC}-{args.partition}", layout, args.batch_records)
        wrote = time.perf_counter() - t0
        print(f"wrote {args.records:,} records ({args.keys:,} distinct keys, {args.groups} groups) in "
              f"{-(-args.records // args.batch_records):,} batches, {nbytes / 1e6:.1f} MB, to "
              f"{OFFSETS_TOPIC}-{args.partition} in {wrote:.1f} s", flush=True)
        baseline = idle_peak_rss(tmp, args.offsets_partitions)
        print(f"idle kcoord peak RSS: {baseline / 1024:.0f} MiB", flush=True)
        for run in range(1, args.runs + 1):
            r = load_once(data_dir, layout, args.partition, args.offsets_partitions, args.poll_interval,
                          args.samples)
            print(f"run {run}: listening after {r.listening_s:.2f} s; first served answer after {r.served_s:.2f} s "
                  f"-> {args.records / r.served_s:,.0f} records/s end to end")
            if r.logged_ms is not None:
                print(f"  kcoord log: {r.logged_line.strip()}")
                print(f"  pure load: {r.logged_ms / 1000:.2f} s -> {args.records / (r.logged_ms / 1000):,.0f} "
                      f"records/s ({r.logged_records:,} records reported)")
            else:
                print("  kcoord log: no 'loaded N records' line found for the partition")
                failed = True
            print(f"  peak RSS {r.peak_rss_kib / 1024:.0f} MiB (RSS {r.rss_kib / 1024:.0f} MiB), "
                  f"{(r.peak_rss_kib - baseline) * 1024 / args.keys:.0f} bytes per distinct key over an idle kcoord")
            print(f"  offsets checked: {r.checked}, wrong: {len(r.wrong)}")
            for w in r.wrong[:10]:
                print(f"    WRONG {w}")
            failed = failed or bool(r.wrong) or r.logged_records != args.records
            runs.append({
                "served_s": round(r.served_s, 3), "listening_s": round(r.listening_s, 3),
                "load_ms": r.logged_ms, "peak_rss_kib": r.peak_rss_kib, "wrong": len(r.wrong),
            })
    if args.json:
        print(json.dumps(report))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
