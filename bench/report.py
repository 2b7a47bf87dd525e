"""Turns measurements into the stdout tables and the JSON document: derived figures, ratios, targets."""

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from bench.commit_floor import FloorProbe
from bench.restart import RestartResult
from bench.scenarios import FsyncProbe, Measurement

CLIENT_BOUND = 0.9  # client thread above 90% of a core: the figure says more about the client
PEERS = ("mock", "tansu", "echo")
CLUSTER = "kcoord-x2"  # kcoord as a cluster of two processes: its ratios and targets are printed beside kcoord's


def percentile(ordered: list[float], q: float) -> float:
    """Latency percentile in ms of an already sorted list (nearest rank)."""
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


BURST_GAP_S = 0.005  # slow requests closer than this in time belong to one burst
BURST_MIN = 50  # requests: a burst this long is a queue, not a slow sync or a stray wake-up


def slow_bursts(latencies: list[float], rate: float) -> dict[str, float] | None:
    """How a paced run's slowest 1% (over its p99) is spread in time: latencies in the order their
    answers came, request i taken to be ~i/rate into the window. Slow requests within BURST_GAP_S of
    each other make one burst. Most of them in bursts of BURST_MIN or more means queues that formed
    (the server fell behind for that long), not single slow syncs."""
    if len(latencies) < 100 or rate <= 0:
        return None
    threshold = sorted(latencies)[int(0.99 * len(latencies))]
    slow = [i for i, lat in enumerate(latencies) if lat > threshold]
    if not slow:
        return None
    bursts: list[tuple[int, int, int]] = []  # first index, last index, slow requests in it
    for i in slow:
        if bursts and (i - bursts[-1][1]) / rate <= BURST_GAP_S:
            first, _, count = bursts[-1]
            bursts[-1] = (first, i, count + 1)
        else:
            bursts.append((i, i, 1))
    long_ones = [b for b in bursts if b[2] >= BURST_MIN]
    return {"threshold_ms": threshold * 1e3, "slow": len(slow), "bursts": len(bursts),
            "in_long_bursts": sum(b[2] for b in long_ones) / len(slow), "long_bursts": len(long_ones),
            "longest_ms": max((b[1] - b[0]) / rate for b in bursts) * 1e3}


def figures(m: Measurement) -> dict[str, Any]:
    """The derived figures of one measurement, as they appear in the table and in the JSON."""
    s = m.sample
    lat = sorted(s.latencies)
    rate = s.requests / s.seconds if s.seconds else 0.0
    return {
        "scenario": m.scenario.name,
        "server": m.server,
        "commit_version": m.versions.commit,
        "fetch_version": m.versions.fetch,
        "connections": m.connections,
        "inflight": m.inflight,
        "rate_target": m.rate_target,
        "seconds": round(s.seconds, 3),
        "requests": s.requests,
        "req_per_s": rate,
        "partition_offsets_per_s": rate * m.partitions_per_request,
        "p50_ms": percentile(lat, 0.5),
        "p99_ms": percentile(lat, 0.99),
        "p999_ms": percentile(lat, 0.999),
        "server_cpu_share": s.server_cpu_s / s.seconds if s.server_cpu_s is not None and s.seconds else None,
        "server_cpu_us_per_req": s.server_cpu_s / s.requests * 1e6 if s.server_cpu_s is not None and s.requests
        else None,
        "client_cpu_share": s.client_cpu_s / s.seconds if s.seconds else 0.0,
        "errors": sum(s.errors.values()),
        "error_kinds": dict(s.errors),
        "unanswered": s.unanswered,
        "late": s.late if m.rate_target else None,
        "slow_bursts": slow_bursts(s.latencies, rate) if m.rate_target else None,
        "late_after_ms": s.late_after_s * 1e3,
        "held": s.held if m.rate_target else None,
        "client": s.client,
        "records_per_fsync": m.records_per_fsync,
        "by_node": m.by_node,
        "loadavg_1m": m.loadavg[0],
    }


def _num(value: float | None, fmt: str = ",.0f", none: str = "-") -> str:
    return none if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, fmt)


def measurement_table(rows: list[dict[str, Any]]) -> list[str]:
    cols = [("scenario", 13, "<"), ("server", 9, "<"), ("ver", 5, "<"), ("req/s", 9, ">"), ("offsets/s", 10, ">"),
            ("p50 ms", 7, ">"), ("p99 ms", 7, ">"), ("p999 ms", 8, ">"), ("srv CPU", 7, ">"), ("us/req", 7, ">"),
            ("client", 7, ">"), ("err", 4, ">"), ("lost", 4, ">"), ("rec/fsync", 9, ">"), ("load", 5, ">")]
    head = " ".join(f"{name:{align}{width}}" for name, width, align in cols)
    lines = [head, "-" * len(head)]
    for r in rows:
        client = _num(r["client_cpu_share"] * 100, ".0f") + "%" + ("!" if r["client_cpu_share"] > CLIENT_BOUND else "")
        share = r["server_cpu_share"]
        values = [r["scenario"], r["server"], f"{r['commit_version']}/{r['fetch_version']}", _num(r["req_per_s"]),
                  _num(r["partition_offsets_per_s"]), _num(r["p50_ms"], ".2f"), _num(r["p99_ms"], ".2f"),
                  _num(r["p999_ms"], ".2f"), _num(share * 100 if share is not None else None, ".0f", "n/a") +
                  ("%" if share is not None else ""), _num(r["server_cpu_us_per_req"], ".1f", "n/a"), client,
                  str(r["errors"]), str(r["unanswered"]), _num(r["records_per_fsync"], ".1f"),
                  _num(r["loadavg_1m"], ".2f")]
        lines.append(" ".join(f"{v:{align}{width}}" for v, (_, width, align) in zip(values, cols, strict=True)))
    return lines


def ratios(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """kcoord's req/s over each peer's, per scenario (the same as the partition-offsets/s ratio); then
    the two-process cluster's over each peer's and over kcoord's (what the second process bought)."""
    by = {(r["scenario"], r["server"]): r for r in rows}
    out: dict[str, dict[str, float]] = {}
    for base, others in (("kcoord", PEERS), (CLUSTER, ("kcoord", *PEERS))):
        for (scenario, server), r in by.items():
            if server != base:
                continue
            for peer in others:
                other = by.get((scenario, peer))
                if other and other["req_per_s"]:
                    out.setdefault(scenario, {})[f"{base}/{peer}"] = r["req_per_s"] / other["req_per_s"]
    return out


@dataclass
class Target:
    """One of the issue's targets: printed as met or missed, never a failure."""

    name: str
    wanted: str
    measured: str
    met: bool | None  # None: not measured in this run


def targets(rows: list[dict[str, Any]], ratio: dict[str, dict[str, float]], fsync: FsyncProbe | None,
            restarts: list[RestartResult], floor: FloorProbe | None = None) -> list[Target]:
    out = []

    def vs(name: str, scenario: str, peer: str, floor: float, unit: str, server: str = "kcoord") -> None:
        got = ratio.get(scenario, {}).get(f"{server}/{peer}")
        if server != "kcoord":
            if got is None:
                return  # the cluster's twins of the targets only where it ran
            name = f"{name}, {server}"
        out.append(Target(name, f">= {floor:g}x {peer} ({unit})", _num(got, ".3f", "not measured") +
                          ("x" if got is not None else ""), None if got is None else got >= floor))

    for server in ("kcoord", CLUSTER):
        vs("durable 1-partition commits", "commit-1", "mock", 0.5, "req/s", server)
        vs("durable 1-partition commits", "commit-1", "tansu", 3.0, "req/s", server)
        vs("1-partition fetches", "fetch-1", "mock", 0.7, "req/s", server)
        vs("100-partition commits", "commit-100", "mock", 0.2, "partition-offsets/s", server)
    for server in ("kcoord", CLUSTER):
        name = "p99 commit latency at half kcoord's peak" + ("" if server == "kcoord" else f", {server}")
        half = next((r for r in rows if r["scenario"] == "commit-1-half" and r["server"] == server), None)
        if half and fsync:
            got, bound = half["p99_ms"], 3 * fsync.p99_ms
            # ``floor``: the one of kcoord's layout (the journal's, its default), else the syncfs one
            against = f" ({got / floor.p99_ms:.1f}x the group-commit floor's {floor.p99_ms:.2f} ms, {floor.how})" \
                if floor else ""
            out.append(Target(name, f"<= 3x fsync p99 = {bound:.2f} ms", f"{got:.2f} ms{against}", got <= bound))
        elif server == "kcoord":
            out.append(Target(name, "<= 3x fsync p99", "not measured", None))
    for r in restarts:
        label = f"restart {r.records:,} records"
        replayed = r.replayed_per_s
        out.append(Target(f"{label}: replay", ">= 1,000,000 records/s", _num(replayed, ",.0f", "not logged"),
                          None if replayed is None else replayed >= 1_000_000))
        if r.keys == 1_000_000:
            out.append(Target(f"{label}: 1M live keys served", "<= 1.00 s from process start",
                              f"{r.served_s:.2f} s", r.served_s <= 1.0))
        out.append(Target(f"{label}: RSS per cached offset", "<= 200 B", f"{r.rss_per_offset:.0f} B",
                          r.rss_per_offset <= 200))
    if not restarts:
        out.append(Target("restart", ">= 1M records/s, 1M keys in 1 s, <= 200 B/offset", "not measured", None))
    return out


def restart_table(restarts: list[RestartResult]) -> list[str]:
    head = (f"{'records':>11} {'keys':>11} {'MB':>6} {'write s':>7} {'listen s':>8} {'served s':>8} {'load s':>7} "
            f"{'replayed/s':>11} {'end-to-end/s':>12} {'peak RSS':>10} {'B/offset':>8} {'checked':>7} {'wrong':>5}")
    lines = [head, "-" * len(head)]
    for r in restarts:
        load_s = _num(r.load_ms / 1000 if r.load_ms else None, ".2f")
        lines.append(f"{r.records:>11,} {r.keys:>11,} {r.log_bytes / 1e6:>6.0f} {r.write_s:>7.1f} "
                     f"{r.listening_s:>8.2f} {r.served_s:>8.2f} {load_s:>7} {_num(r.replayed_per_s):>11} "
                     f"{r.end_to_end_per_s:>12,.0f} {r.peak_rss_kib / 1024:>6.0f} MiB {r.rss_per_offset:>8.0f} "
                     f"{r.checked:>7} {len(r.wrong):>5}")
    return lines


def paced_note(r: dict[str, Any]) -> str:
    """How a paced row was paced, and how many of its requests went out late or were held back."""
    return (f"{r['scenario']} {r['server']}: paced at {r['rate_target']:,.0f} req/s by the {r['client']} (open loop, "
            f"latency from when each request was due); of {r['requests']:,} measured requests, {r['late']:,} went "
            f"out over two pacing ticks ({r['late_after_ms']:g} ms) after they were due and {r['held']:,} waited "
            f"because {r['inflight']} were already outstanding on their connection{_bursts_note(r)}")


def cluster_note(r: dict[str, Any]) -> str:
    """How a cluster row's load was shared: each node's connections and answers."""
    seconds = r["seconds"] or math.nan
    nodes = ", ".join(f"node {n['node_id']} {n['requests'] / seconds:,.0f} req/s on {n['connections']} x "
                      f"{r['inflight']}" for n in r["by_node"])
    return (f"{r['scenario']} {r['server']}: {nodes} (each group's requests to its coordinator, found by "
            f"FindCoordinator; the run's connections split over the nodes)")


def _bursts_note(r: dict[str, Any]) -> str:
    b = r.get("slow_bursts")
    if not b:
        return ""
    bursts = f"{b['long_bursts']} burst{'' if b['long_bursts'] == 1 else 's'}"
    return (f"; of the {b['slow']:,} over its p99 ({b['threshold_ms']:.2f} ms), {b['in_long_bursts']:.0%} came in "
            f"{bursts} of {BURST_MIN} or more (slow requests under {BURST_GAP_S * 1e3:g} ms apart; the longest "
            f"burst {b['longest_ms']:.0f} ms): queues, where that share is high, not single slow syncs")


def render(rows: list[dict[str, Any]], ratio: dict[str, dict[str, float]], goals: list[Target],
           fsync: FsyncProbe | None, restarts: list[RestartResult], floor: FloorProbe | None = None,
           out: Callable[[str], None] = print, journal: FloorProbe | None = None) -> None:
    if rows:
        for line in measurement_table(rows):
            out(line)
        for r in rows:
            if r["rate_target"]:
                out(paced_note(r))
            if r.get("by_node"):
                out(cluster_note(r))
        out("")
    if ratio:
        out("ratios (req/s; the same for partition-offsets/s):")
        for scenario, rs in ratio.items():
            out(f"  {scenario:<13} " + "  ".join(f"{k} {v:.3f}" for k, v in rs.items()))
        out("")
    if fsync:
        out(f"fsync probe ({fsync.count} x write 200 B + fsync in {fsync.path}): p50 {fsync.p50_ms:.3f} ms, "
            f"p99 {fsync.p99_ms:.3f} ms, p999 {fsync.p999_ms:.3f} ms, mean {fsync.mean_ms:.3f} ms")
        out("")
    if floor:
        out(f"group-commit floor (one thread appending every commit due, {floor.how}, again at once; "
            f"bench/commit_floor.py) at {floor.rate:,.0f} commits/s over {floor.logs} logs: p50 {floor.p50_ms:.3f} "
            f"ms, p99 {floor.p99_ms:.3f} ms, p999 {floor.p999_ms:.3f} ms; {floor.syncs_per_s:,.0f} syncs/s, "
            f"{floor.logs_per_sync:.1f} logs per sync")
        if journal:
            out(f"  the same with {journal.how} (kcoord's layout with --sync-mode journal, its default): "
                f"p50 {journal.p50_ms:.3f} ms, p99 {journal.p99_ms:.3f} ms, p999 {journal.p999_ms:.3f} ms; "
                f"{journal.syncs_per_s:,.0f} syncs/s")
        out("")
    if restarts:
        out("restart (kcoord only):")
        for line in restart_table(restarts):
            out(line)
        out("")
    out("targets (reported, not enforced):")
    for t in goals:
        verdict = {True: "met", False: "MISSED", None: "-"}[t.met]
        out(f"  {verdict:<6} {t.name}: {t.wanted}; measured {t.measured}")


def document(meta: dict[str, Any], rows: list[dict[str, Any]], ratio: dict[str, dict[str, float]],
             goals: list[Target], fsync: FsyncProbe | None, restarts: list[RestartResult],
             failures: list[str], floor: FloorProbe | None = None,
             journal: FloorProbe | None = None) -> dict[str, Any]:
    """The JSON document: the same figures as the tables, plus how and where they were measured."""
    def clean(value: Any) -> Any:
        if isinstance(value, float):
            return None if math.isnan(value) else round(value, 4)
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    restart_rows = [{**asdict(r), "replayed_per_s": r.replayed_per_s, "end_to_end_per_s": r.end_to_end_per_s,
                     "rss_bytes_per_offset": r.rss_per_offset} for r in restarts]
    doc: dict[str, Any] = clean({
        **meta,
        "measurements": rows,
        "ratios": ratio,
        "fsync_probe": asdict(fsync) if fsync else None,
        "group_commit_floor": asdict(floor) if floor else None,
        "journal_commit_floor": asdict(journal) if journal else None,
        "restart": restart_rows,
        "targets": [asdict(t) for t in goals],
        "failures": failures,
    })
    return doc
