"""Restart: how fast kcoord loads a big ``__consumer_offsets`` partition and what it costs in memory.

Writes one partition directory with N OffsetCommit records (v2 batches of ~1000 records, written with
kcoord's own code through bench/kcoord_api.py, so the bytes are what kcoord writes), starts a real
kcoord on it and polls with a raw OffsetFetch v6 for a group of that partition until the answer is no
longer COORDINATOR_LOAD_IN_PROGRESS (14). Then it checks that sampled offsets are the last ones
written and reports: records/s replayed (from kcoord's own ``loaded N records in X ms`` line), the
time from process start (Popen) to the first served answer, peak RSS (VmHWM) and its growth over an
idle kcoord per cached offset.

Record ``i`` commits offset ``i`` for key ``i % keys``; keys are spread over groups that all hash to
the chosen partition, 100 partitions per topic. With ``keys`` below ``records`` later records
overwrite earlier ones, as a long-lived log does between compactions.
"""

import random
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka.protocol.consumer.group import OffsetFetchRequest, OffsetFetchResponse

from bench.kcoord_api import (
    OFFSETS_TOPIC,
    KcoordProcess,
    byte_compile,
    loaded_line,
    offsets_partition,
    write_offsets_partition,
)
from bench.wire import SIZE, recv_frame

PARTITIONS_PER_TOPIC = 100
FETCH_VERSION = 6
LOAD_IN_PROGRESS = 14
FetchTopic = OffsetFetchRequest[FETCH_VERSION].OffsetFetchRequestTopic


@dataclass(frozen=True)
class Layout:
    """Which (group, topic, partition) key a record index writes, and what survives."""

    records: int
    keys: int
    groups: tuple[str, ...]

    @property
    def keys_per_group(self) -> int:
        return -(-self.keys // len(self.groups))

    def key(self, k: int) -> tuple[str, str, int]:
        group, j = divmod(k, self.keys_per_group)
        topic, partition = divmod(j, PARTITIONS_PER_TOPIC)
        return self.groups[group], f"topic-{topic}", partition

    def final_offset(self, k: int) -> int:
        """The committed offset of key ``k`` after every record: that of the last record writing it."""
        return k + self.keys * ((self.records - 1 - k) // self.keys)

    def commits(self) -> Iterator[tuple[str, str, int, int]]:
        for i in range(self.records):
            yield (*self.key(i % self.keys), i)


def groups_on(partition: int, partitions: int, count: int) -> tuple[str, ...]:
    """``count`` group ids that Kafka's hash puts on ``partition``."""
    out: list[str] = []
    i = 0
    while len(out) < count:
        name = f"load-group-{i}"
        if offsets_partition(name, partitions) == partition:
            out.append(name)
        i += 1
    return tuple(out)


# -- a tiny blocking OffsetFetch client -------------------------------------------------------------


def fetch(sock: socket.socket, correlation_id: int, group: str, topic: str, partition: int) -> Any:
    req = OffsetFetchRequest[FETCH_VERSION](
        group_id=group, topics=[FetchTopic(name=topic, partition_indexes=[partition])], require_stable=False
    )
    req.with_header(correlation_id=correlation_id, client_id="kcoord-bench-restart")
    sock.sendall(bytes(req.encode(header=True, framed=True)))
    frame = recv_frame(sock)
    got = SIZE.unpack_from(frame)[0]
    if got != correlation_id:
        raise RuntimeError(f"correlation id {got}, expected {correlation_id}")
    return OffsetFetchResponse[FETCH_VERSION].decode(frame[5:], version=FETCH_VERSION)


def connect(kcoord: KcoordProcess, deadline: float) -> socket.socket:
    while True:
        assert kcoord.proc is not None
        if kcoord.proc.poll() is not None:
            raise RuntimeError(f"kcoord exited with {kcoord.proc.returncode}:\n{kcoord.log()[-3000:]}")
        try:
            return socket.create_connection(("127.0.0.1", kcoord.port), timeout=60)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def memory_kib(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmHWM", "VmRSS"):
            out[name] = int(value.split()[0])
    return out


# -- one restart ------------------------------------------------------------------------------------


@dataclass
class RestartResult:
    records: int
    keys: int
    log_bytes: int
    write_s: float
    listening_s: float = 0.0
    served_s: float = 0.0  # process start (Popen) to the first answer that is not load-in-progress
    load_ms: float | None = None  # kcoord's own figure for loading the partition
    peak_rss_kib: int = 0
    idle_peak_rss_kib: int = 0
    checked: int = 0
    wrong: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def replayed_per_s(self) -> float | None:
        return self.records / (self.load_ms / 1000) if self.load_ms else None

    @property
    def end_to_end_per_s(self) -> float:
        return self.records / self.served_s if self.served_s else 0.0

    @property
    def rss_per_offset(self) -> float:
        return (self.peak_rss_kib - self.idle_peak_rss_kib) * 1024 / self.keys


def load_once(data_dir: Path, layout: Layout, partition: int, offsets_partitions: int, poll_interval: float,
              samples: int, result: RestartResult) -> RestartResult:
    """Starts kcoord on ``data_dir``, measures one load into ``result`` (which holds the write figures)."""
    kcoord = KcoordProcess(data_dir, "--offsets-partitions", str(offsets_partitions))
    started = time.perf_counter()
    kcoord.start(wait=False)
    problems = result.problems
    try:
        assert kcoord.proc is not None
        sock = connect(kcoord, time.monotonic() + 60)
        result.listening_s = time.perf_counter() - started
        group, topic, part = layout.key(0)
        correlation_id = 0
        deadline = time.monotonic() + 1800
        with sock:
            while True:
                correlation_id += 1
                error = fetch(sock, correlation_id, group, topic, part).error_code
                if error != LOAD_IN_PROGRESS:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError("partition still loading after 1800 s")
                time.sleep(poll_interval)
            result.served_s = time.perf_counter() - started
            result.peak_rss_kib = memory_kib(kcoord.proc.pid).get("VmHWM", 0)
            if error:
                raise RuntimeError(f"OffsetFetch answered error {error} after loading:\n{kcoord.log()[-3000:]}")
            wrong = result.wrong
            rng = random.Random(42)
            picks = [0, layout.keys - 1, *(rng.randrange(layout.keys) for _ in range(samples))]
            for k in picks:
                group, topic, part = layout.key(k)
                correlation_id += 1
                resp = fetch(sock, correlation_id, group, topic, part)
                p = resp.topics[0].partitions[0]
                expected = layout.final_offset(k)
                if resp.error_code or p.error_code or p.committed_offset != expected:
                    wrong.append(f"{group}/{topic}/{part}: error {resp.error_code}/{p.error_code}, "
                                 f"offset {p.committed_offset}, expected {expected}")
    finally:
        code = kcoord.stop(timeout=120)
        if code:
            problems.append(f"kcoord exited with {code}")
    found = loaded_line(kcoord.log(), partition)
    if found is None:
        problems.append(f"no 'partition {partition}: loaded N records' line in kcoord's log")
    elif found[1] != layout.records:
        problems.append(f"kcoord loaded {found[1]} records, {layout.records} were written")
    result.load_ms = found[2] if found else None
    result.checked = len(picks)
    return result


def idle_peak_rss(directory: Path, offsets_partitions: int) -> int:
    """VmHWM of a kcoord that loaded nothing: the baseline the partition's cost is measured from."""
    kcoord = KcoordProcess(directory, "--offsets-partitions", str(offsets_partitions)).start()
    try:
        assert kcoord.proc is not None
        time.sleep(0.5)
        return memory_kib(kcoord.proc.pid).get("VmHWM", 0)
    finally:
        kcoord.stop()


def restart(tmp: Path, records: int, keys: int | None = None, groups: int = 1000, partition: int = 7,
            offsets_partitions: int = 50, batch_records: int = 1000, poll_interval: float = 0.005,
            samples: int = 20, runs: int = 1, progress: Any = None) -> list[RestartResult]:
    """Writes the partition once under ``tmp``, then loads it ``runs`` times; one result per load."""
    keys = keys or records
    layout = Layout(records, keys, groups_on(partition, offsets_partitions, min(groups, keys)))
    data_dir = tmp / f"restart-{records}-data"
    t0 = time.perf_counter()
    nbytes = write_offsets_partition(data_dir / f"{OFFSETS_TOPIC}-{partition}", layout.commits(), batch_records)
    wrote = time.perf_counter() - t0
    if progress:
        progress(f"wrote {records:,} records ({keys:,} keys, {len(layout.groups)} groups), {nbytes / 1e6:.1f} MB, "
                 f"in {wrote:.1f} s")
    byte_compile()  # restarts are of kcoord as installed (bench/kcoord_api.py)
    if progress:
        progress("wrote the bytecode of kcoord's modules first, as pip install does")
    idle = idle_peak_rss(tmp / f"restart-{records}-idle", offsets_partitions)
    return [
        load_once(data_dir, layout, partition, offsets_partitions, poll_interval, samples,
                  RestartResult(records, keys, nbytes, wrote, idle_peak_rss_kib=idle))
        for _ in range(runs)
    ]
