"""What waking another process costs on this machine: a pipe ping-pong, same CPU and across CPUs.

Every request kcoord answers crosses processes (the client's, kcoord's loop, the sync helper), and
on the harness's VM the price of those wake-ups moves from boot to boot: on 2026-11-28 a round trip
between two processes took ~3.6 us on one CPU and 71-90 us across the two (an idle CPU halts at once,
`guest_halt_poll_ns` 0 on the kernel's command line, and the hypervisor wakes it), 5.6 us with the
guest polling 200 us before it halts, which raised kcoord's commit-1 by ~20% and left the in-process
mock's alone (bench/README.md). So the harness prints this probe before its scenarios: it tells a slow
window from a slow change.

    python -m bench.wakeup [--round-trips N]
"""

import argparse
import os
import time
from dataclasses import dataclass
from pathlib import Path

HALT_POLL = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns")


@dataclass
class WakeupProbe:
    """Microseconds of wall time per round trip; None where the machine cannot place the pair so."""

    same_cpu_us: float
    cross_cpu_us: float | None
    round_trips: int
    guest_halt_poll_ns: int | None  # the guest's cpuidle-haltpoll setting, when the kernel has it


def _round_trip_us(parent_cpu: int, child_cpu: int, round_trips: int) -> float:
    """Forks a child that echoes one byte per read; both pinned as asked. Wall time per round trip."""
    to_child, from_parent = os.pipe()
    from_child, to_parent = os.pipe()
    before = os.sched_getaffinity(0)
    pid = os.fork()
    if pid == 0:  # the echo: nothing but the pipe, then out without running the parent's atexit
        try:
            os.sched_setaffinity(0, {child_cpu})
            os.close(from_parent)
            os.close(from_child)
            for _ in range(round_trips):
                if not os.read(to_child, 1):
                    break
                os.write(to_parent, b"x")
        finally:
            os._exit(0)
    os.close(to_child)  # the child's ends: a child gone early is then an EOF here, not a wait for ever
    os.close(to_parent)
    try:
        os.sched_setaffinity(0, {parent_cpu})
        os.write(from_parent, b"x")  # one unmeasured round trip: the child is placed and running
        if not os.read(from_child, 1):
            raise RuntimeError("the echo process ended")
        start = time.perf_counter()
        for _ in range(round_trips - 1):
            os.write(from_parent, b"x")
            if not os.read(from_child, 1):
                raise RuntimeError("the echo process ended")
        elapsed = time.perf_counter() - start
    finally:
        os.sched_setaffinity(0, before)
        os.close(from_parent)  # the child, if still reading, sees EOF and ends
        os.close(from_child)
        os.waitpid(pid, 0)
    return elapsed / (round_trips - 1) * 1e6


def probe(round_trips: int = 20000) -> WakeupProbe:
    if round_trips < 2:
        raise ValueError("round_trips: at least 2 (one is not measured)")
    cpus = sorted(os.sched_getaffinity(0))
    same = _round_trip_us(cpus[0], cpus[0], round_trips)
    cross = _round_trip_us(cpus[0], cpus[1], round_trips) if len(cpus) > 1 else None
    try:
        halt_poll: int | None = int(HALT_POLL.read_text())
    except (OSError, ValueError):
        halt_poll = None
    return WakeupProbe(same, cross, round_trips, halt_poll)


def describe(p: WakeupProbe) -> str:
    cross = f"{p.cross_cpu_us:.1f} us across CPUs" if p.cross_cpu_us is not None else "one CPU only"
    poll = f"; guest_halt_poll_ns {p.guest_halt_poll_ns}" if p.guest_halt_poll_ns is not None else ""
    return f"wake-up probe (pipe round trip between two processes): {p.same_cpu_us:.1f} us on one CPU, {cross}{poll}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--round-trips", type=int, default=20000, help="at least 2 (default %(default)s)")
    args = parser.parse_args()
    if args.round_trips < 2:
        parser.error("--round-trips: at least 2 (the first is not measured)")
    print(describe(probe(args.round_trips)))


if __name__ == "__main__":
    main()
