"""The flusher's handling of a finished cycle (coordinator/flusher.py), with shards that only record
what the flusher asks of them."""

import errno
from typing import Any

import pytest

from coordinator.flusher import Flusher, FlushOutcome
from coordinator.metrics import Metrics
from coordinator.writer import WriterThread
from storage.sync import FileSync


class RecordingShard:
    def __init__(self, written_ahead: bool = False) -> None:
        self.written_ahead = written_ahead
        self.calls: list[str] = []
        self.log: Any = None

    def take_batch(self) -> Any | None:
        return None

    def append_batch(self, work: Any) -> int:
        return 0

    def write_ahead(self) -> None:
        pass

    def synced(self, work: Any) -> None:
        self.calls.append("synced")

    def flushed(self, work: Any, started: float, outcome: FlushOutcome) -> None:
        self.calls.append("failed" if isinstance(outcome, BaseException) else "released")

    def fail_write(self, exc: BaseException) -> None:
        self.calls.append("fail_write")


@pytest.mark.parametrize("sync_failed", [False, True])
def test_shards_that_appended_ahead_fail_with_a_failed_sync_only(sync_failed: bool) -> None:
    """A failed append touched one log: the shard that appended ahead meanwhile is left alone. A failed
    sync may have lost its pages too (a syncfs error is not told apart by file), so it fails."""
    flusher = Flusher(WriterThread(), FileSync(), Metrics())
    good, bad, ahead = RecordingShard(), RecordingShard(), RecordingShard(written_ahead=True)
    flusher._asked[id(ahead)] = ahead
    error = OSError(errno.EIO, "injected")
    flusher._finish([(good, object()), (bad, object())], 0.0, [100, error], error if sync_failed else None)
    assert good.calls == ["synced", "released"] and bad.calls == ["failed"]
    assert ahead.calls == (["fail_write"] if sync_failed else [])
    flusher.close()
