"""Power loss, simulated: with ``--sync-mode journal`` (the default) the partition logs reach the disk
only at checkpoints, so a machine that loses power can come back with any of their unsynced bytes gone
or torn. ``kill -9`` alone cannot show that (the page cache survives it), so after the kill every log
file is cut back to what it held on disk when the server started, and a torn tail of garbage is left
on some; the journal, whose syncs every acknowledgement waited for, is left as it was, with a torn
entry after its end. Every acknowledged commit must still be there."""

import os
from pathlib import Path

from tests.integration.test_durability import _fetch_when_loaded, pipelined_commits_then_kill
from tests.kcoord_process import KcoordProcess
from tests.rawclient import RawClient


def _lose_unsynced_log_bytes(data_dir: Path, on_disk: dict[Path, int]) -> int:
    """Cuts every segment back to its size at start (a segment created since is emptied), then leaves
    a torn batch's worth of garbage on every other one; returns the bytes lost."""
    lost = 0
    for i, path in enumerate(sorted(data_dir.glob("__consumer_offsets-*/*.log"))):
        size = path.stat().st_size
        keep = on_disk.get(path, 0)
        lost += size - keep
        with open(path, "r+b") as f:
            f.truncate(keep)
            if i % 2 and size > keep:
                f.seek(keep)
                f.write(os.urandom(min(size - keep, 700)))
    return lost


def test_acknowledged_commits_survive_losing_every_log_byte_not_yet_checkpointed(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    kcoord = KcoordProcess(data_dir, "--checkpoint-interval-ms", "3600000").start()
    on_disk = {p: p.stat().st_size for p in data_dir.glob("__consumer_offsets-*/*.log")}
    acked = pipelined_commits_then_kill(kcoord, 3000)
    assert acked, "nothing was acknowledged before the kill"
    assert _lose_unsynced_log_bytes(data_dir, on_disk) > 0, "the logs had nothing unsynced to lose"
    live = sorted((data_dir / "journal").glob("*.journal"))[-1]
    with open(live, "ab") as f:  # an entry torn by the power cut, after every acknowledged one
        f.write(b"\x00\x00\x01\x00\x00\x00\x00\x07" + os.urandom(100))

    kcoord.start()
    try:
        assert "to apply to their logs" in kcoord.log_since_start()
        reader = RawClient(kcoord.port)
        for group, offset in acked.items():
            got = _fetch_when_loaded(reader, group).topics[0].partitions[0].committed_offset
            assert got >= offset, f"{group}: acknowledged offset {offset} lost, the server has {got}"
        reader.close()
        # The logs were rewritten from the journal and fsynced: a clean stop then needs no journal.
        assert kcoord.stop() == 0
        assert list((data_dir / "journal").glob("*.journal")) == []
        kcoord.start()
        reader = RawClient(kcoord.port)
        for group, offset in acked.items():
            assert _fetch_when_loaded(reader, group).topics[0].partitions[0].committed_offset >= offset
        reader.close()
    finally:
        kcoord.stop()  # also when an assertion failed: no server left behind
