"""storage.dirlock: one server per data directory, and readers (the pipeline) that keep servers out
while they read."""

import os
from pathlib import Path

import pytest

from storage.dirlock import LOCK_FILE, DirectoryInUse, lock_directory, share_directory


def test_a_reader_holds_even_a_directory_no_server_has_locked_yet(tmp_path: Path) -> None:
    """A reshard's output, or a copy made without its lock file: the reader makes the file, so a
    server cannot start there while it reads (a review found the hold missing there)."""
    assert not (tmp_path / LOCK_FILE).exists()
    fd = share_directory(tmp_path)
    assert fd is not None and (tmp_path / LOCK_FILE).exists()
    with pytest.raises(DirectoryInUse):
        lock_directory(tmp_path)
    second = share_directory(tmp_path)  # readers share it
    assert second is not None
    os.close(fd)
    os.close(second)
    server = lock_directory(tmp_path)
    assert server is not None
    with pytest.raises(DirectoryInUse, match="in use by a running kcoord"):
        share_directory(tmp_path)
    os.close(server)


def test_a_missing_directory_is_left_to_the_caller(tmp_path: Path) -> None:
    assert share_directory(tmp_path / "nowhere") is None
