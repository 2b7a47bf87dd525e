"""The sync helper process, for real: it fsyncs and syncfs's the descriptors it is sent, reports the
kernel's errors, survives the signals a terminal or service manager sends a process group, and
a helper that dies is noticed: a sync in flight fails (it may not have happened), later ones are
refused so the caller syncs another way, and one whose server died exits by itself."""

import asyncio
import errno
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from storage.sync import SYNCFS
from storage.synchelper import OP_FSYNC, OP_SYNCFS, SyncHelper, SyncHelperGone


class Answers:
    """Collects the helper's answers; ``next()`` waits for the next one."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()

    def __call__(self, *args: Any) -> None:
        self.queue.put_nowait(args)

    async def next(self, timeout: float = 10.0) -> tuple[Any, ...]:
        return await asyncio.wait_for(self.queue.get(), timeout)


async def started() -> SyncHelper:
    helper = SyncHelper()
    assert helper.start(asyncio.get_running_loop())
    return helper


def gone(pid: int, timeout: float = 10.0) -> bool:
    """True once ``pid`` no longer runs (reaped, or a zombie nobody waits for)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.01)
    return False


async def test_it_fsyncs_the_descriptor_it_is_sent(tmp_path: Path) -> None:
    helper, answers = await started(), Answers()
    fd = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for i in range(3):
            os.write(fd, b"x" * 200)
            assert helper.post(OP_FSYNC, fd, answers, "cycle", i)
            assert await answers.next() == ("cycle", i, None, pytest.approx(0.05, abs=10))
        os.write(fd, b"still ours")  # the helper closed its copy; ours is untouched
    finally:
        os.close(fd)
        helper.close()


@pytest.mark.skipif(SYNCFS is None, reason="syncfs needs Linux 5.8+")
async def test_it_syncs_a_file_system_through_a_directory_descriptor(tmp_path: Path) -> None:
    helper, answers = await started(), Answers()
    watcher = os.open(tmp_path, os.O_RDONLY)
    try:
        (tmp_path / "dirty").write_bytes(b"y" * 4096)
        assert helper.post(OP_SYNCFS, watcher, answers)
        error, seconds = await answers.next()
        assert error is None and seconds >= 0
    finally:
        os.close(watcher)
        helper.close()


async def test_the_kernels_error_comes_back_as_an_oserror() -> None:
    helper, answers = await started(), Answers()
    read_end, write_end = os.pipe()
    try:
        assert helper.post(OP_FSYNC, read_end, answers)  # a pipe cannot be fsynced: EINVAL
        error, _ = await answers.next()
        assert isinstance(error, OSError) and error.errno == errno.EINVAL
        assert helper.alive  # an error is an answer, not a death
        assert helper.post(99, read_end, answers)  # an operation it does not know
        error, _ = await answers.next()
        assert isinstance(error, OSError) and error.errno == errno.EINVAL
    finally:
        os.close(read_end)
        os.close(write_end)
        helper.close()


async def test_one_request_at_a_time(tmp_path: Path) -> None:
    helper, answers = await started(), Answers()
    fd = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT)
    try:
        assert helper.post(OP_FSYNC, fd, answers, 1)
        assert not helper.post(OP_FSYNC, fd, answers, 2)
        assert await answers.next() == (1, None, pytest.approx(0.05, abs=10))
        assert helper.post(OP_FSYNC, fd, answers, 3)
        assert (await answers.next())[0] == 3
    finally:
        os.close(fd)
        helper.close()


async def test_a_helper_killed_with_a_sync_in_flight_fails_that_sync_and_is_not_asked_again(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    helper, answers = await started(), Answers()
    assert helper.pid is not None
    fd = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT)
    try:
        assert helper.post(OP_FSYNC, fd, answers)
        await answers.next()  # it has started and answered once
        os.kill(helper.pid, signal.SIGSTOP)  # the next request waits in its socket
        assert helper.post(OP_FSYNC, fd, answers, "in flight")
        await asyncio.sleep(0.05)
        assert answers.queue.empty()
        with caplog.at_level(logging.ERROR, logger="storage.synchelper"):
            os.kill(helper.pid, signal.SIGKILL)
            label, error, _ = await answers.next()
        assert label == "in flight" and isinstance(error, SyncHelperGone) and error.errno == errno.EIO
        assert "may not be durable" in str(error)
        assert not helper.alive
        assert not helper.post(OP_FSYNC, fd, answers)  # refused: the caller syncs another way
        assert "syncing from the writer thread from now on" in caplog.text
    finally:
        os.close(fd)
        helper.close()


async def test_a_helper_killed_while_idle_is_noticed(caplog: pytest.LogCaptureFixture) -> None:
    helper = await started()
    assert helper.pid is not None
    with caplog.at_level(logging.ERROR, logger="storage.synchelper"):
        os.kill(helper.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while helper.alive:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
    assert f"the sync helper process (pid {helper.pid}) exited" in caplog.text
    helper.close()


async def test_it_ignores_sigint_and_sigterm_and_exits_when_closed(tmp_path: Path) -> None:
    helper, answers = await started(), Answers()
    pid = helper.pid
    assert pid is not None
    fd = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT)
    try:
        assert helper.post(OP_FSYNC, fd, answers)
        await answers.next()  # past its start-up, where the handlers are set
        os.kill(pid, signal.SIGINT)  # Ctrl-C in a terminal reaches the whole group
        os.kill(pid, signal.SIGTERM)  # so may a service manager's stop
        await asyncio.sleep(0.1)
        assert helper.post(OP_FSYNC, fd, answers)
        assert (await answers.next())[0] is None
    finally:
        os.close(fd)
    proc = helper._proc
    helper.close()
    assert proc is not None and proc.returncode == 0  # it ended at the end of its socket, by itself
    assert not helper.alive and helper.pid is None


def test_a_helper_whose_server_died_exits() -> None:
    """The server killed with SIGKILL: the helper sees its socket close and exits (no orphan)."""
    server = subprocess.Popen(
        [sys.executable, "-c",
         "import asyncio, sys, time\n"
         "from storage.synchelper import SyncHelper\n"
         "async def main():\n"
         "    h = SyncHelper(); assert h.start(asyncio.get_running_loop())\n"
         "    print(h.pid, flush=True); time.sleep(60)\n"
         "asyncio.run(main())\n"],
        stdout=subprocess.PIPE, cwd=Path(__file__).parents[2])
    try:
        assert server.stdout is not None
        pid = int(server.stdout.readline())
        assert not gone(pid, timeout=0.2)
        server.kill()
        server.wait(10)
        assert gone(pid)
    finally:
        if server.poll() is None:
            server.kill()
