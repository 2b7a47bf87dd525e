import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.gateway_bench import _kcoord_cpu


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def test_a_kcoord_gone_mid_run_ends_the_bench_with_its_status() -> None:
    """Unreaped, as the bench leaves its kcoord while rounds run: an exited child is a zombie whose /proc
    entry still reads, so its CPU would have been reported as if it were alive."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert _kcoord_cpu(proc) >= 0.0
        proc.kill()
        deadline = time.monotonic() + 10
        while _state(proc.pid) != "Z":
            assert time.monotonic() < deadline, "the killed child never became a zombie"
            time.sleep(0.01)
        with pytest.raises(SystemExit, match=rf"kcoord \(pid {proc.pid}\) exited mid-run, status -9"):
            _kcoord_cpu(proc)
    finally:
        proc.kill()
        proc.wait()
    with pytest.raises(SystemExit, match=rf"kcoord \(pid {proc.pid}\) exited mid-run, status -9"):
        _kcoord_cpu(proc)
