"""``snapshot`` on Spark against kcoord's own loader, on the same offsets log.

    python -m bench.pipeline_bench                       # 1M and 5M records, local[1] and local[2]
    python -m bench.pipeline_bench --records 200000 --masters 'local[2]' --partitions 1

For each size a log is written with storage/ code (as kcoord's writer writes it: one v2 batch per
commit of a consumer's 8 partitions, groups spread over the partitions by Kafka's hash), then, each in a
process of its own so none inherits another's memory or JVM:

- ``kcoord loader``: kcoord's ``Runtime`` loading every partition (``coordinator.loader.replay_log``: decode_batch,
  decode_record, ShardData.replay), the single-process baseline;
- ``decoder, no Spark``: the pipeline's decoding and map-side combine in one process (what each Spark
  task runs), to tell Spark's overhead from the decoding itself;
- ``snapshot local[N]``: the whole job (read, plan, decode, combine, resolve, aggregate, sort, write
  parquet, count the output) in a fresh session, then once more in it ("again"). The session's fixed
  start-up (the JVM, then Python workers and Arrow, which a first tiny job starts: ~10 s here, once per
  session whatever the log) is measured before and reported apart.

Records/s is records in the log over seconds; "per core vs loader" divides by N. The goal (issue #9):
per core within 1.5x of the loader (>= 0.67), and local[2] faster than the loader outright at 5M.
"""

import argparse
import asyncio
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from protocol.partitioning import partition_for
from protocol.records import OffsetAndMetadata, OffsetKey, encode_offset_key, encode_offset_value
from storage.batchwriter import build_batch
from storage.log import PartitionLog

T0 = 1_700_000_000_000
PARTITIONS_PER_GROUP = 8


def generate(directory: Path, records: int, partitions: int, groups: int) -> dict[str, Any]:
    """A log of ``records`` offset commits: commit i is group i % groups committing its 8 partitions."""
    started = time.perf_counter()
    logs = {p: PartitionLog(directory / f"__consumer_offsets-{p}") for p in range(partitions)}
    next_offset = dict.fromkeys(range(partitions), 0)
    placement = [partition_for(f"group-{g}", partitions) for g in range(groups)]
    commits = records // PARTITIONS_PER_GROUP
    for c in range(commits):
        g = c % groups
        p = placement[g]
        ts = T0 + c  # one commit per ms
        value_offset = c // groups
        entries: list[tuple[bytes, bytes | None]] = [
            (encode_offset_key(OffsetKey(f"group-{g}", "events", i)),
             encode_offset_value(OffsetAndMetadata(value_offset * 100 + i, -1, "", ts)))
            for i in range(PARTITIONS_PER_GROUP)]
        base = next_offset[p]
        logs[p].append(build_batch(base, entries, ts), base + PARTITIONS_PER_GROUP - 1)
        next_offset[p] = base + PARTITIONS_PER_GROUP
    size = 0
    for plog in logs.values():
        plog.sync()
        plog.checkpoint()
        size += plog.size_bytes
        plog.close()
    return {"records": commits * PARTITIONS_PER_GROUP, "bytes": size, "generate_s": time.perf_counter() - started}


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime + children.ru_utime + children.ru_stime


def run_loader(directory: Path, partitions: int) -> dict[str, Any]:
    from coordinator.config import Config
    from coordinator.runtime import Runtime

    async def load() -> dict[str, Any]:
        runtime = Runtime(Config(data_dir=directory, offsets_partitions=partitions))
        cpu, started = _cpu_s(), time.perf_counter()
        runtime.start()
        await runtime.wait_loaded()
        seconds = time.perf_counter() - started
        offsets = sum(s.data.num_offsets for s in runtime.shards)
        await runtime.stop(asyncio.get_running_loop().time() + 10)
        return {"seconds": seconds, "cpu_s": _cpu_s() - cpu, "offsets": offsets}

    return asyncio.run(load())


def run_decoder(directory: Path) -> dict[str, Any]:
    from pipeline.decode import latest_per_key, rows, to_batch
    from pipeline.layout import files_for, find_segments
    from pipeline.snapshot import READ_COLUMNS
    from pipeline.splits import Split

    cpu, started = _cpu_s(), time.perf_counter()
    kept = 0
    for seg in find_segments([str(directory)]):
        out = list(latest_per_key(rows(Split(seg, 0, seg.size), files_for(seg.path), lambda d: None)))
        kept += to_batch(out, READ_COLUMNS).num_rows
    return {"seconds": time.perf_counter() - started, "cpu_s": _cpu_s() - cpu, "rows_after_combine": kept}


def _identity(batches: Iterator[Any]) -> Iterator[Any]:
    yield from batches


def run_spark(directory: Path, master: str, out: Path) -> dict[str, Any]:
    """The snapshot job twice in one fresh session, after the session's fixed start-up: the JVM, and the
    Python workers and Arrow started by a first tiny mapInArrow (~10 s here on its own, paid once per
    session whatever the job)."""
    from pipeline.cli import add_jobs, run
    from pipeline.session import build_session

    started = time.perf_counter()
    spark = build_session(master, "kcoord-pipeline-bench", progress=False)
    spark.range(0, 2, 1, 2).mapInArrow(_identity, "id long").collect()
    session_s = time.perf_counter() - started
    parser = argparse.ArgumentParser()
    add_jobs(parser)
    args = parser.parse_args(["snapshot", "--data-dir", str(directory), "--out", str(out)])
    started = time.perf_counter()
    code = run(args, spark=spark)
    seconds = time.perf_counter() - started
    offsets = spark.read.parquet(str(out)).count()
    args.out = str(out) + "-again"
    started = time.perf_counter()
    code = code or run(args, spark=spark)
    again_s = time.perf_counter() - started
    spark.stop()
    return {"seconds": seconds, "again_s": again_s, "session_s": session_s, "exit": code, "offsets": offsets}


def in_child(*argv: str) -> dict[str, Any]:
    """Runs one measurement in a fresh interpreter; its last stdout line is the JSON result, to which the
    1-minute load average at its end is added (the machine may be shared)."""
    result = subprocess.run([sys.executable, "-m", "bench.pipeline_bench", *argv], capture_output=True, text=True,
                            check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{result.stderr[-3000:]}")
    parsed: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    parsed["load"] = os.getloadavg()[0]
    return parsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", default="1000000,5000000", help="log sizes (comma-separated)")
    parser.add_argument("--masters", default="local[1],local[2]", help="Spark masters (comma-separated)")
    parser.add_argument("--partitions", type=int, default=50, help="offsets partitions of the log (default 50)")
    parser.add_argument("--groups", type=int, default=5000, help="groups committing (default 5000)")
    parser.add_argument("--dir", type=Path, default=None, help="where to write the logs (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, directory = args.child[0], Path(args.child[1])
        if kind == "loader":
            result = run_loader(directory, int(args.child[2]))
        elif kind == "decoder":
            result = run_decoder(directory)
        else:
            result = run_spark(directory, args.child[2], Path(args.child[3]))
        print(json.dumps(result))
        return 0

    root = args.dir or Path(tempfile.mkdtemp(prefix="kcoord-pipeline-bench-"))
    results: list[dict[str, Any]] = []
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start", file=sys.stderr)
    for records in (int(r) for r in args.records.split(",")):
        log_dir = root / f"log-{records}"
        shutil.rmtree(log_dir, ignore_errors=True)
        facts = generate(log_dir, records, args.partitions, args.groups)
        print(f"{facts['records']:,} records, {facts['bytes']:,} bytes in {args.partitions} partitions "
              f"(written in {facts['generate_s']:.1f} s)", file=sys.stderr)
        loader = in_child("--child", "loader", str(log_dir), str(args.partitions))
        rows = [("kcoord loader (1 process)", 1, loader["seconds"], loader)]
        decoder = in_child("--child", "decoder", str(log_dir))
        rows.append(("decoder, no Spark (1 process)", 1, decoder["seconds"], decoder))
        for master in args.masters.split(","):
            threads = re.sub(r"\D", "", master)
            out = root / f"out-{records}-{threads}"
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(str(out) + "-again", ignore_errors=True)
            spark = in_child("--child", "spark", str(log_dir), master, str(out))
            if spark["exit"] != 0 or spark["offsets"] != loader["offsets"]:
                raise RuntimeError(f"snapshot on {master} disagrees with the loader: {spark} vs {loader}")
            cores = int(threads) if threads else os.cpu_count() or 1
            rows.append((f"snapshot {master}", cores, spark["seconds"], spark))
            rows.append((f"snapshot {master}, again", cores, spark["again_s"], {"load": spark["load"]}))
        base_rate = facts["records"] / loader["seconds"]
        print(f"\n{facts['records']:,} records ({facts['bytes'] / 1e6:.0f} MB), {loader['offsets']:,} offsets")
        print(f"{'what':34} {'seconds':>8} {'records/s':>11} {'per core':>10} {'per core vs loader':>19} "
              f"{'load':>6}")
        for name, cores, seconds, extra in rows:
            rate = facts["records"] / seconds
            print(f"{name:34} {seconds:8.1f} {rate:11,.0f} {rate / cores:10,.0f} {rate / cores / base_rate:18.2f}x"
                  f" {extra['load']:6.2f}" + (f"   (+{extra['session_s']:.1f} s session start-up)"
                                              if "session_s" in extra else ""))
            results.append({"records": facts["records"], "bytes": facts["bytes"], "what": name, "cores": cores,
                            "seconds": seconds, "records_per_s": rate, **extra})
        sys.stdout.flush()
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    if args.dir is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
