"""A record that does not parse inside a whole batch (its CRC holds: only a writer other than kcoord makes
one) in a real kcoord's log, over the wire, in both builds: the compiled one (where this install built
it) and pure Python (``KCOORD_PURE_PYTHON=1``). Both judge the batch as recovery does first, then read
its records, as Kafka's log recovery and then its loader do (tests/coordinator/test_loader.py says
what each case is); the compiled build read the records first and failed the partition in the last two
cases, where pure Python served it."""

from pathlib import Path

import pytest

import storage.batch
from protocol import compiled
from protocol.errors import ErrorCode
from storage import loadcodec
from storage.log import PartitionLog
from storage.segments import list_segments
from tests.coordinator.test_loader import good, unparseable
from tests.kcoord_process import KcoordProcess
from tests.rawclient import RawClient, commit_request, fetch_request


@pytest.fixture(params=["compiled", "interpreted"])
def build(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The build the kcoord processes run: the environment they inherit says."""
    if request.param == "interpreted":
        monkeypatch.setenv("KCOORD_PURE_PYTHON", "1")
    elif compiled.pure_python_forced() or not loadcodec.COMPILED or storage.batch.codec_stale():
        pytest.skip("this install has no compiled loader that is current (no C compiler, or KCOORD_PURE_PYTHON)")
    return str(request.param)


def committed(server: KcoordProcess) -> tuple[int, list[int]]:
    """OffsetFetch of group g's partitions t/0-2: ``(error, offsets)``."""
    client = RawClient(server.port)
    reply = client.call(fetch_request("g", {"t": [0, 1, 2]}), 5)
    client.close()
    return reply.error_code, [p.committed_offset for t in reply.topics for p in t.partitions]


def three_commits(server: KcoordProcess) -> Path:
    """Commits t/0 at offsets 0-2, one batch each (log offsets 0-2); the partition's directory."""
    client = RawClient(server.port)
    for offset in range(3):
        assert client.call(commit_request("g", {("t", 0): offset}), 8).topics[0].partitions[0].error_code == 0
    client.close()
    return server.data_dir / "__consumer_offsets-0"


def appended(directory: Path, batches: list[bytes]) -> None:
    """Appended past the recovery point a clean stop recorded (synced, not recorded)."""
    plog = PartitionLog(directory)
    list(plog.recover())
    for raw in batches:
        plog.append(raw, int.from_bytes(raw[:8], "big") + int.from_bytes(raw[23:27], "big"))
    plog.sync(checkpoint=False)
    plog.close()


def set_aside(directory: Path) -> list[Path]:
    return list(directory.glob("*.tr"))


@pytest.mark.usefixtures("build")
def test_a_kept_batch_fails_its_partition_and_nothing_is_cut(tmp_path: Path) -> None:
    server = KcoordProcess(tmp_path / "data", "--offsets-partitions", "1").start()
    directory = three_commits(server)
    server.stop()
    appended(directory, [unparseable(3), good(5)])  # in order, past the recovery point
    before = [s.path.read_bytes() for s in list_segments(directory)]
    server.start()
    try:
        assert committed(server) == (ErrorCode.NOT_COORDINATOR, [])
        assert "partition 0: FAILED to load" in server.log_since_start()
        assert "batch at offsets [3, 4]: OffsetCommitValue" in server.log_since_start()
    finally:
        server.stop()
    assert [s.path.read_bytes() for s in list_segments(directory)] == before and set_aside(directory) == []


@pytest.mark.usefixtures("build")
def test_one_whose_offsets_go_back_past_the_recovery_point_is_cut_aside(tmp_path: Path) -> None:
    server = KcoordProcess(tmp_path / "data", "--offsets-partitions", "1").start()
    directory = three_commits(server)
    server.stop()
    appended(directory, [unparseable(1), good(3)])
    server.start()
    try:
        assert committed(server) == (ErrorCode.NONE, [2, -1, -1])
        assert "damaged tail past the recovery point (batch offset 1 below expected 3)" in server.log_since_start()
    finally:
        server.stop()
    assert len(set_aside(directory)) == 1


@pytest.mark.usefixtures("build")
def test_one_where_the_journals_run_starts_is_replaced_by_it(tmp_path: Path) -> None:
    """kill -9 before any checkpoint: the journal holds the three commits, and the log's first batch was
    overwritten by another writer's meanwhile. The journal's run replaces it (kept aside)."""
    server = KcoordProcess(tmp_path / "data", "--offsets-partitions", "1", "--checkpoint-interval-ms", "600000")
    directory = three_commits(server.start())
    server.kill()
    segment = list_segments(directory)[0].path
    first = int.from_bytes(segment.read_bytes()[8:12], "big") + 12
    segment.write_bytes(unparseable(0) + segment.read_bytes()[first:])
    server.start()
    try:
        assert committed(server) == (ErrorCode.NONE, [2, -1, -1])
        assert "not what the journal holds" in server.log_since_start()
    finally:
        server.stop()
    assert len(set_aside(directory)) == 1
