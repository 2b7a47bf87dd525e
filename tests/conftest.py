"""Shared fixtures: a real kcoord server process per test that needs one."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kcoord_process import KcoordProcess


@pytest.fixture
def kcoord(tmp_path: Path) -> Iterator[KcoordProcess]:
    """A running kcoord (default 50 partitions) with its own data directory; stopped after the test."""
    server = KcoordProcess(tmp_path / "data").start()
    yield server
    if server.proc is not None and server.proc.poll() is None:
        server.kill()
