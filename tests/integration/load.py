"""A well-behaved bystander client that commits and reads back in a loop on its own thread, timing
every round trip, so a test can show what some other client's behaviour costs everyone else."""

import threading
import time

from tests.rawclient import RawClient, commit_request, fetch_request


class Bystander:
    def __init__(self, port: int, group: str = "bystander") -> None:
        self._client = RawClient(port, timeout=60)
        self._group = group
        self.latencies_ms: list[float] = []  # commit + fetch back
        self.commit_ms: list[float] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Bystander":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)
        self._client.close()

    def _run(self) -> None:
        offset = 0
        while not self._stop.is_set():
            offset += 1
            started = time.perf_counter()
            try:
                resp = self._client.call(commit_request(self._group, {("t", 0): offset}), 8)
                self.commit_ms.append((time.perf_counter() - started) * 1000)
                error = resp.topics[0].partitions[0].error_code
                fetched = self._client.call(fetch_request(self._group, {"t": [0]}), 7)
            except OSError as exc:
                self.errors.append(repr(exc))
                return
            self.latencies_ms.append((time.perf_counter() - started) * 1000)
            if error != 0 or fetched.topics[0].partitions[0].committed_offset != offset:
                self.errors.append(f"commit {offset}: error {error}")
            time.sleep(0.002)

    def worst_ms(self) -> float:
        return max(self.latencies_ms, default=0.0)

    def percentile_ms(self, q: float, commits_only: bool = False) -> float:
        ordered = sorted(self.commit_ms if commits_only else self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0
