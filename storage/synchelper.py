"""A helper process that makes flush cycles durable, so the event loop never waits for the GIL.

Why a process: a writer thread that fsyncs needs the GIL twice per cycle (to take the job, and after
the fsync to hand the result back), and while the event loop is busy each of those waits for the
switch interval or for the loop's next pass; then the loop waits to get the GIL back. Measured
(bench/sync_handoff.py: one durable append per cycle, the loop kept busy with 20 us callbacks, three
runs): with a thread 31-393 cycles/s and a p99 of 21-114 ms, with this helper 3,300-4,900 cycles/s
and a p99 of 0.33-0.53 ms, and the loop kept 3-15% more of its time for its callbacks. With the loop
idle both reach the disk's ~4.4-4.8k cycles/s at ~125-140 us of CPU per cycle, most of it the
fsync's own kernel time. The loop's side of a cycle is one ``sendmsg`` and one readable callback.

The helper runs one system call per request: ``fsync``, ``fdatasync`` or ``syncfs`` of a descriptor the loop sends
with it (``SCM_RIGHTS``), then closes its copy and answers with the errno and the call's seconds.
A descriptor passed that way shares its open file description with the sender's, so the kernel's
writeback-error reporting (which is per open file description, and per file system for ``syncfs``)
is exactly as if the loop's process had made the call. That is also why a helper that dies with a
sync in flight fails that cycle rather than retrying it: the sync may have consumed an error that a
retry would no longer see. The flusher then syncs from its writer thread for the rest of the process.

This file is also the helper's program (``python -I -S synchelper.py FD``): it imports only the
standard library, and ignores SIGINT, SIGTERM and SIGHUP, ending when the server's end of the socket closes
(its exit, even by SIGKILL, closes it), so a terminal's Ctrl-C or a service manager signalling the
whole group cannot end it under a clean shutdown that still syncs. On Linux it also asks the kernel
to kill it when the server's process ends (``PR_SET_PDEATHSIG``), stopped or not. The signal follows
the thread that started it: the event loop's, which lives as long as the process.
"""

import array
import errno
import logging
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the helper's own start-up imports only what it runs
    import asyncio
    import subprocess

log = logging.getLogger(__name__)

OP_FSYNC = 1
OP_SYNCFS = 2
OP_FDATASYNC = 3  # the journal's (storage.journal): its size changes are all the metadata it needs
_REPLY = struct.Struct("=id")  # errno (0: done), seconds the call took
EXIT_WAIT_S = 0.5  # how long close() waits for the helper to exit before killing it


class SyncHelperGone(OSError):
    """The helper ended before answering: the sync may or may not have happened."""


class SyncHelper:
    """The event loop's side: at most one request in flight (the flusher runs one cycle at a time)."""

    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: tuple[Callable[..., None], tuple[Any, ...]] | None = None

    @property
    def alive(self) -> bool:
        return self._sock is not None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self, loop: "asyncio.AbstractEventLoop") -> bool:
        """Spawns the helper; False (and a warning) if it cannot: the caller syncs another way."""
        import subprocess

        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        except (OSError, AttributeError) as exc:  # no SOCK_SEQPACKET here
            log.warning("cannot start the sync helper process (%s); syncing from the writer thread", exc)
            return False
        try:
            self._proc = subprocess.Popen([sys.executable, "-I", "-S", __file__, str(theirs.fileno())],
                                          pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        except (OSError, ValueError, TypeError) as exc:  # TypeError: no sys.executable (embedded)
            ours.close()
            log.warning("cannot start the sync helper process (%s); syncing from the writer thread", exc)
            return False
        finally:
            theirs.close()
        ours.setblocking(False)
        loop.add_reader(ours.fileno(), self._readable)
        self._sock, self._loop = ours, loop
        return True

    def post(self, op: int, fd: int, callback: Callable[..., None], *args: Any) -> bool:
        """Asks for ``op`` on ``fd``; later, on the loop, ``callback(*args, error, seconds)`` with error
        None when the call succeeded. False if nothing was sent (no helper, or one is in flight)."""
        sock = self._sock
        if sock is None or self._waiting is not None:
            return False
        try:
            sock.sendmsg([bytes((op,))], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", (fd,)))])
        except OSError as exc:  # nothing reached it, so nothing was synced: the caller syncs another way
            self._died(f"could not be reached ({exc})")
            return False
        self._waiting = (callback, args)
        return True

    def _readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        try:
            data = sock.recv(64)
        except (BlockingIOError, InterruptedError):
            return
        except ConnectionResetError:  # it died with our request unread
            data = b""
        except OSError as exc:
            self._died(f"failed ({exc})")
            return
        if len(data) != _REPLY.size or self._waiting is None:
            self._died("exited" if not data else f"sent {data!r} unasked")
            return
        code, seconds = _REPLY.unpack(data)
        callback, args = self._waiting
        self._waiting = None
        callback(*args, OSError(code, os.strerror(code)) if code else None, seconds)

    def _died(self, why: str) -> None:
        status = self._proc.poll() if self._proc is not None else None
        log.error("the sync helper process (pid %s) %s%s; syncing from the writer thread from now on",
                  self.pid, why, f", exit status {status}" if status is not None else "")
        self._drop_socket()
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            callback, args = waiting
            callback(*args, SyncHelperGone(errno.EIO, "the sync helper process ended before answering: the "
                                                      "batch may not be durable"), 0.0)

    def _drop_socket(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(sock.fileno())
            sock.close()

    def close(self) -> None:
        """Ends the helper (its socket closes; it exits). A request in flight is not answered: by now
        the shards have stopped waiting for it."""
        self._waiting = None
        self._drop_socket()
        proc, self._proc = self._proc, None
        if proc is not None:
            import subprocess

            try:
                proc.wait(EXIT_WAIT_S)
            except subprocess.TimeoutExpired:  # stuck in a sync: do not hold the shutdown for it
                proc.kill()
                try:
                    proc.wait(0.1)  # reaped, unless the kernel holds it in the sync (then the exit reaps it)
                except subprocess.TimeoutExpired:
                    pass


def _syncfs() -> Callable[[int], int]:
    import ctypes  # only when asked for: a helper that only fsyncs starts faster without it

    libc = ctypes.CDLL(None, use_errno=True)
    fn = libc.syncfs
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int

    def call(fd: int) -> int:
        return 0 if fn(fd) == 0 else ctypes.get_errno() or errno.EIO

    return call


def _fsync(fd: int) -> int:
    try:
        os.fsync(fd)
    except OSError as exc:
        return exc.errno or errno.EIO
    return 0


def _fdatasync(fd: int) -> int:
    try:
        os.fdatasync(fd)
    except OSError as exc:
        return exc.errno or errno.EIO
    return 0


def serve(sock: socket.socket) -> None:
    """The helper's loop: one request (an op byte and one descriptor) at a time, until EOF."""
    calls: dict[int, Callable[[int], int]] = {OP_FSYNC: _fsync, OP_FDATASYNC: _fdatasync}
    while True:
        msg, fds, _, _ = socket.recv_fds(sock, 16, 4)
        if not msg:
            return
        started = time.perf_counter()
        if len(fds) != 1:
            code = errno.EBADF
        else:
            op = msg[0]
            if op == OP_SYNCFS and op not in calls:
                calls[OP_SYNCFS] = _syncfs()
            call = calls.get(op)
            code = call(fds[0]) if call is not None else errno.EINVAL
        for fd in fds:
            os.close(fd)
        sock.send(_REPLY.pack(code, time.perf_counter() - started))


def _end_with_the_server() -> None:
    """Linux: the kernel kills this process when the server's process ends. The socket's end already
    ends it, but only if it runs: a stopped helper (SIGSTOP, a debugger) outlived a kill -9 of the
    server for ever (a fault campaign's find). Elsewhere the socket is all there is."""
    parent = os.getppid()
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) != 0:  # PR_SET_PDEATHSIG
            return
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the server ended before the call: nothing would send the signal
        os._exit(0)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a terminal's hangup stops the server gracefully too
    if sys.platform.startswith("linux"):
        _end_with_the_server()
    try:
        serve(socket.socket(fileno=int(sys.argv[1])))
    except (BrokenPipeError, ConnectionResetError):  # the server is gone
        pass
