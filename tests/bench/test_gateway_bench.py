import subprocess
import sys

import pytest

from bench.gateway_bench import _kcoord_cpu


def test_a_kcoord_gone_mid_run_ends_the_bench_with_its_status() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert _kcoord_cpu(proc) >= 0.0
    finally:
        proc.kill()
        proc.wait()
    with pytest.raises(SystemExit, match=rf"kcoord \(pid {proc.pid}\) exited mid-run, status -9"):
        _kcoord_cpu(proc)
