"""The librdkafka mock cluster (inside the confluent-kafka wheel) as an upstream, in a process of its own:
it lives as long as the client object that created it, so a helper process holds one and prints its
bootstrap address; the test ends it by closing its stdin (or killing it).

    python -m tests.gateway.mock_cluster 3      # prints "BOOTSTRAP host:port,host:port,..." then waits
"""

import subprocess
import sys
import time

import confluent_kafka as ck


def main() -> None:
    brokers = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    producer = ck.Producer({"test.mock.num.brokers": brokers, "log_level": 3})
    meta = producer.list_topics(timeout=10)
    addresses = ",".join(f"{b.host}:{b.port}" for _, b in sorted(meta.brokers.items()))
    print(f"BOOTSTRAP {addresses}", flush=True)
    sys.stdin.read()  # until the test closes our stdin
    del producer


class MockCluster:
    """Starts the helper; ``bootstrap`` is its brokers' addresses."""

    def __init__(self, brokers: int = 3) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.gateway.mock_cluster", str(brokers)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 30
        line = ""
        while not line.startswith("BOOTSTRAP") and time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line and self.proc.poll() is not None:
                raise RuntimeError("mock cluster helper exited")
        self.bootstrap = line.split()[1]

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


if __name__ == "__main__":
    main()
