"""How fast kcoord loads a big ``__consumer_offsets`` partition: the harness's restart scenario on its
own, with the knobs the harness does not expose (overwritten keys, groups, batch size, repeated loads).

Run from the repository root: ``python -m bench.load_bench --help``. The method is described in
bench/restart.py; ``python -m bench.harness --scenarios restart-1m`` runs the same measurement.
"""

import argparse
import json
import os
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from bench import report
from bench.restart import restart


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.load_bench", description=(__doc__ or "").split("\n\n")[0])
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
    with tempfile.TemporaryDirectory(prefix="kcoord-load-bench-") as tmp:
        results = restart(Path(tmp), args.records, args.keys, args.groups, args.partition, args.offsets_partitions,
                          args.batch_records, args.poll_interval, args.samples, args.runs, progress=print)
    for line in report.restart_table(results):
        print(line)
    failed = False
    for r in results:
        for problem in r.problems + [f"WRONG {w}" for w in r.wrong[:10]]:
            print(f"  {problem}")
        failed = failed or bool(r.problems or r.wrong)
    print(f"load average after the run: {os.getloadavg()[0]:.2f}")
    if args.json:
        print(json.dumps([{**asdict(r), "replayed_per_s": r.replayed_per_s} for r in results]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
