"""What making k dirty logs durable costs on this disk, each way kcoord could do it.

For k logs with one small append each: one ``syncfs`` of their file system (what kcoord does for two
or more), an ``fdatasync`` per log one after another, ``fdatasync`` per log from k threads at once,
and two ``syncfs`` calls overlapping (the second started while the first runs, each over k fresh
logs; the time is for both). Tells whether syncs that overlap could shorten a commit's wait: they do
not if two overlapping calls take as long as two in a row. Then the same 200 B written into logs
preallocated with zeros (written over in place: no file grows, no block is allocated, so a sync has
no size to journal), made durable by one ``syncfs`` or by ``fdatasync`` from k threads: whether
preallocated segments would make the syncs cheaper (they did not here: bench/README.md).

Run from the repository root: ``python -m bench.sync_cost [--logs 1,4,14] [--rounds 1500] [--dir D]``.
"""

import argparse
import os
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from storage.sync import SYNCFS

RECORD = b"x" * 200


def summary(times: list[float]) -> str:
    times = sorted(times)
    return (f"p50 {times[len(times) // 2] * 1e3:.3f} ms, p99 {times[int(len(times) * 0.99)] * 1e3:.3f} ms, "
            f"mean {sum(times) / len(times) * 1e3:.3f} ms")


def measure(directory: Path, counts: list[int], rounds: int) -> list[str]:
    if SYNCFS is None:
        raise SystemExit("syncfs is not available here (Linux 5.8+ with a libc that has it)")
    syncfs = SYNCFS
    most = max(counts)
    fds = [os.open(directory / f"log{i}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600) for i in range(2 * most)]
    dir_fd = os.open(directory, os.O_RDONLY)
    pre = [os.open(directory / f"pre{i}", os.O_RDWR | os.O_CREAT, 0o600) for i in range(most)]
    room = len(RECORD) * rounds * (len(counts) * 2)
    for fd in pre:
        os.write(fd, bytes(room))
        os.fsync(fd)
    os.fsync(dir_fd)
    written = [0] * most
    pool = ThreadPoolExecutor(most)
    lines = []
    try:
        def append(i: int, fd: int) -> None:
            os.write(fd, RECORD)

        def overwrite(i: int, fd: int) -> None:  # into a preallocated log, in place
            os.pwrite(fd, RECORD, written[i])
            written[i] += len(RECORD)

        def timed(name: str, k: int, sync: Callable[[list[int]], None], logs: list[int] = fds,
                  write: Callable[[int, int], None] = append) -> None:
            times = []
            for _ in range(rounds):
                for i, fd in enumerate(logs[:k]):
                    write(i, fd)
                start = time.perf_counter()
                sync(logs[:k])
                times.append(time.perf_counter() - start)
            lines.append(f"{name:<34} {k:>3} logs: {summary(times)}")

        def overlapping(k: int) -> None:
            times = []
            for _ in range(rounds):
                for fd in fds[:k]:
                    os.write(fd, RECORD)
                start = time.perf_counter()
                first = threading.Thread(target=syncfs, args=(dir_fd,))
                first.start()
                for fd in fds[k:2 * k]:
                    os.write(fd, RECORD)
                syncfs(dir_fd)
                first.join()
                times.append(time.perf_counter() - start)
            lines.append(f"{'two syncfs overlapping (both)':<34} {k:>3} logs: {summary(times)}")

        def in_turn(logs: list[int]) -> None:
            for fd in logs:
                os.fdatasync(fd)

        def in_threads(logs: list[int]) -> None:
            for _ in pool.map(os.fdatasync, logs):
                pass

        for k in counts:
            timed("one syncfs", k, lambda _: syncfs(dir_fd))
            timed("fdatasync per log, in turn", k, in_turn)
            timed("fdatasync per log, k threads", k, in_threads)
            overlapping(k)
            timed("preallocated, one syncfs", k, lambda _: syncfs(dir_fd), pre, overwrite)
            timed("preallocated, fdatasync k threads", k, in_threads, pre, overwrite)
    finally:
        pool.shutdown()
        for fd in fds + pre:
            os.close(fd)
        os.close(dir_fd)
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", default="1,4,14", help="comma-separated numbers of dirty logs")
    parser.add_argument("--rounds", type=int, default=1500)
    parser.add_argument("--dir", type=Path, default=Path.cwd(), help="where to create the scratch files "
                        "(default: here, the disk kcoord's default data dir is on)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kcoord-sync-cost-", dir=args.dir) as tmp:
        for line in measure(Path(tmp), [int(k) for k in args.logs.split(",")], args.rounds):
            print(line, flush=True)


if __name__ == "__main__":
    main()
