"""The flush cycle's hand-off, side by side: a writer thread against the sync helper process.

Each cycle appends 200 bytes to a file on the event loop, has it fsynced elsewhere and waits for the
answer on the loop before the next cycle (as the flusher does). ``thread`` posts the fsync to
coordinator.writer's WriterThread (the GIL is taken after the job arrives and after the fsync, and
the answer comes back through ``call_soon_threadsafe``); ``process`` sends it to
storage.synchelper's SyncHelper (one ``sendmsg`` with the descriptor, one readable callback). Both
run with kcoord's GIL switch interval, with the loop idle and with the loop kept busy by callbacks of
``--busy-us`` each (a saturated server), alternating, in one run. Reported per variant: cycles/s,
the cycle's p50/p99, the busy callbacks completed per second (what the loop kept for requests) and
the process's CPU per cycle (all threads and, for ``process``, the helper's).

    python -m bench.sync_handoff [--seconds 3] [--busy-us 20] [--rounds 2] [--dir DIR]
"""

import argparse
import asyncio
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from coordinator.cli import tune_interpreter
from coordinator.writer import WriterThread
from storage.synchelper import OP_FSYNC, SyncHelper


def _spin(us: float) -> None:
    end = time.perf_counter() + us / 1e6
    while time.perf_counter() < end:
        pass


def _cpu() -> float:
    """This process's CPU and its reaped children's (the helper is reaped when it is closed)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


async def _run(kind: str, busy_us: float, seconds: float, path: Path) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    latencies: list[float] = []
    work = [0]
    stop = False
    done = asyncio.Event()

    def background() -> None:
        if not stop:
            _spin(busy_us)
            work[0] += 1
            loop.call_soon(background)

    writer = WriterThread()
    helper = SyncHelper()
    if kind == "process" and not helper.start(loop):
        raise SystemExit("the sync helper did not start")

    def cycle() -> None:
        os.write(fd, b"x" * 200)
        started = time.perf_counter()
        if kind == "thread":
            writer.post(os.fsync, (fd,), loop, finished, started)
        elif not helper.post(OP_FSYNC, fd, finished, started):
            raise SystemExit("the sync helper went away")

    def finished(started: float, outcome: Any, *_: Any) -> None:
        if isinstance(outcome, BaseException):
            raise SystemExit(f"sync failed: {outcome}")
        latencies.append(time.perf_counter() - started)
        if stop:
            done.set()
        else:
            cycle()

    if busy_us:
        loop.call_soon(background)
    cycle()
    await asyncio.sleep(0.3)  # warm-up
    latencies.clear()
    work[0] = 0
    cpu0, wall0 = _cpu(), time.perf_counter()
    await asyncio.sleep(seconds)
    stop = True
    count, wall = len(latencies), time.perf_counter() - wall0
    await asyncio.wait_for(done.wait(), 5)
    writer.shutdown()
    helper.close()  # reaps the helper, so its CPU is counted
    cpu = _cpu() - cpu0
    os.close(fd)
    latencies.sort()
    return {"variant": kind, "busy_us": busy_us, "cycles_per_s": count / wall,
            "p50_ms": latencies[count // 2] * 1e3, "p99_ms": latencies[int(count * 0.99)] * 1e3,
            "busy_callbacks_per_s": work[0] / wall, "cpu_us_per_cycle": cpu / max(count, 1) * 1e6}


async def _main(args: argparse.Namespace) -> None:
    print(f"{'variant':<9}{'busy us':>8}{'cycles/s':>10}{'p50 ms':>8}{'p99 ms':>9}{'busy cb/s':>11}"
          f"{'CPU us/cycle':>14}")
    with tempfile.TemporaryDirectory(prefix="kcoord-handoff-", dir=args.dir) as tmp:
        for _ in range(args.rounds):
            for busy in (0.0, args.busy_us):
                for kind in ("thread", "process"):
                    r = await _run(kind, busy, args.seconds, Path(tmp) / "log")
                    print(f"{r['variant']:<9}{r['busy_us']:>8.0f}{r['cycles_per_s']:>10,.0f}{r['p50_ms']:>8.3f}"
                          f"{r['p99_ms']:>9.3f}{r['busy_callbacks_per_s']:>11,.0f}{r['cpu_us_per_cycle']:>14.1f}",
                          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--busy-us", type=float, default=20.0, help="CPU of each busy callback on the loop")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dir", default=None, help="where the file is (default: the system's temporary directory)")
    args = parser.parse_args()
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    tune_interpreter()
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
