"""bench/sync_uring.c, the C comparison of the flush cycle's hand-offs: each way really writes and syncs,
and reports one line."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

SOURCE = Path(__file__).parents[2] / "bench" / "sync_uring.c"
LINE = re.compile(r"^(inline|helper|uring) +busy +10 us: +\d+ cycles/s, p50 +[\d.]+ us, p99 +[\d.]+ us, "
                  r"CPU +[\d.]+ us per cycle \( *-?[\d.]+ besides the busy time\)$")


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    out = tmp_path_factory.mktemp("sync_uring") / "sync_uring"
    subprocess.run([cc, "-O2", "-Wall", "-Werror", "-o", str(out), str(SOURCE)], check=True)
    return out


@pytest.mark.parametrize("mode", ["inline", "helper", "uring"])
def test_each_way_writes_syncs_and_reports(program: Path, tmp_path: Path, mode: str) -> None:
    target = tmp_path / "cycles.dat"
    done = subprocess.run([str(program), mode, "30", str(target), "10"], capture_output=True, text=True)
    if mode == "uring" and done.returncode != 0 and "io_uring_setup" in done.stderr:
        pytest.skip(f"io_uring unavailable here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    assert LINE.match(done.stdout.strip()), done.stdout
    data = target.read_bytes()
    written = 30 * 200  # in place, at the start of the preallocated MiB of zeros
    assert len(data) == 1 << 20 and data[:written] == b"x" * written and data[written:].count(0) == len(data) - written


def test_writes_stay_in_place_past_a_lap_of_the_file(program: Path, tmp_path: Path) -> None:
    """A review's find: offsets taken modulo 1 MiB, not a multiple of 200 B, grew the file after 5,242 cycles."""
    target = tmp_path / "cycles.dat"
    done = subprocess.run([str(program), "inline", "5300", str(target)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert target.stat().st_size == 1 << 20


def test_refuses_an_unknown_mode(program: Path, tmp_path: Path) -> None:
    done = subprocess.run([str(program), "sideways", "5", str(tmp_path / "f")], capture_output=True, text=True)
    assert done.returncode == 2 and "MODE is inline, helper or uring" in done.stderr
