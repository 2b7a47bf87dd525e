"""OffsetFetch's handler module (coordinator/apis/k09_offset_fetch.py) beyond what the integration tests
show: a large v8+ request's groups are bucketed, and its answer assembled, on the bulk thread."""

import time
from pathlib import Path

import pytest

from coordinator.apis import k09_offset_fetch as k09
from protocol.hotcodec import YIELD_EVERY
from tests.coordinator.harness import config, started, stop


async def test_many_groups_let_other_threads_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiled code holds the GIL until it returns: bucketing and answering offer it every YIELD_EVERY
    groups, so the event loop is not kept waiting by a request for 100k groups."""
    runtime = await started(config(tmp_path, partitions=4))
    try:
        cls = k09.SPEC.request.cls
        body = cls(groups=[cls.OffsetFetchRequestGroup(group_id=f"g{i}", topics=None)
                           for i in range(2 * YIELD_EVERY + 1)])
        offered: list[float] = []
        monkeypatch.setattr(time, "sleep", offered.append)
        groups = k09.prepare(runtime, body, 8)
        assert isinstance(groups, k09._Groups) and offered == [0, 0]
        assert sum(len(members) for members in groups.by_shard.values()) == len(body.groups)
        answer = groups.response()
        assert [g[0] for g in answer.groups] == [g.group_id for g in body.groups] and offered == [0] * 4
    finally:
        monkeypatch.undo()
        await stop(runtime)
