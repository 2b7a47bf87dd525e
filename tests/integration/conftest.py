"""Fixtures shared by the group-administration tests: a kcoord process tuned for quick rebalances
(modules that need other settings define their own ``server``) and a stable two-member group."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_groups import Member, settled
from tests.kcoord_process import KcoordProcess


@pytest.fixture
def server(tmp_path: Path) -> Iterator[KcoordProcess]:
    proc = KcoordProcess(tmp_path / "data", "--group-initial-rebalance-delay-ms", "300",
                         "--group-min-session-timeout-ms", "1000").start()
    yield proc
    if proc.proc is not None and proc.proc.poll() is None:
        proc.kill()


@pytest.fixture
def live_group(server: KcoordProcess) -> Iterator[list[Member]]:
    """Two aiokafka members (own processes) of group "live", settled on one generation."""
    members = [Member(server, "aiokafka", "live", client_id="aio-a"),
               Member(server, "aiokafka", "live", client_id="aio-b")]
    settled(*members)
    yield members
    for m in members:
        if m.proc.poll() is None:
            m.kill()
