"""Runs the real ``kcoord serve`` in a subprocess on a free loopback port, for tests and benchmarks."""

import os
import random
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LOWEST_PORT = 10_000
_random = random.SystemRandom()  # not the global generator, which hypothesis seeds
_handed_out: set[int] = set()


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def free_port() -> int:
    """A loopback port nothing is bound to, for a server to listen on. Chosen below the kernel's
    ephemeral range where there is room: a port from that range (what binding to port 0 gives) can
    become the local end of any outgoing connection before the server binds it, and a CI run lost a
    test to EADDRINUSE that way. Never the same port twice in one process."""
    start = _ephemeral_start()
    if start > LOWEST_PORT + 1000:
        for _ in range(200):
            port = _random.randrange(LOWEST_PORT, start)
            if port in _handed_out:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _handed_out.add(port)
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: "subprocess.Popen[bytes] | None", log: Path | None, timeout: float = 30.0) -> None:
    """Until something accepts connections on the loopback port; fails early if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-4000:] if log and log.exists() else ""
            raise RuntimeError(f"exited with {proc.returncode} before listening:\n{tail}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout:g} s") from None
            time.sleep(0.02)


class KcoordProcess:
    """One kcoord server process; ``restart()`` keeps the data directory and the port."""

    def __init__(self, data_dir: Path, *extra: str, port: int | None = None, open_files: int | None = None) -> None:
        self.data_dir = data_dir
        self.open_files = open_files  # the server's RLIMIT_NOFILE, soft and hard (None: inherited)
        self.port = port or free_port()
        self.extra = list(extra)
        self.metrics_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"kcoord-{self.port}.log"
        self._log_start = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    def start(self, wait: bool = True, loaded: bool = True) -> "KcoordProcess":
        """Starts kcoord; with ``wait`` returns once it listens and, with ``loaded``, once every
        partition has loaded (before that, requests get COORDINATOR_LOAD_IN_PROGRESS)."""
        cmd = [sys.executable, "-m", "coordinator.cli", "serve", "--listen", self.bootstrap,
               "--data-dir", str(self.data_dir), "--metrics-listen", f"127.0.0.1:{self.metrics_port}", *self.extra]
        log = open(self.log_path, "ab")
        self._log_start = log.tell()
        # KCOORD_TEST_PYTHONPATH: more paths for the server, e.g. a sitecustomize with profiling hooks.
        paths = [str(REPO), os.environ.get("KCOORD_TEST_PYTHONPATH", "")]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env,
                                     preexec_fn=None if self.open_files is None else self._limit_open_files)
        log.close()
        if wait:
            self.wait_listening()
            if loaded:
                self.wait_loaded()
        return self

    def _limit_open_files(self) -> None:
        assert self.open_files is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.open_files, self.open_files))

    def wait_loaded(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while "partitions loaded" not in self.log_since_start():
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"kcoord exited with {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"kcoord did not finish loading:\n{self.log()}")
            time.sleep(0.02)

    def log_since_start(self) -> str:
        with open(self.log_path, "rb") as f:
            f.seek(self._log_start)
            return f.read().decode(errors="replace")

    def wait_listening(self, timeout: float = 30.0) -> None:
        wait_port(self.port, self.proc, self.log_path, timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait: the graceful path. Returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """SIGKILL: the crash path."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def restart(self) -> "KcoordProcess":
        self.stop()
        return self.start()
