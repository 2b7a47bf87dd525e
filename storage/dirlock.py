"""One process per data directory: an exclusive ``flock`` on ``<data-dir>/.lock``, as Kafka locks each
of its log directories.

Two servers on one directory append to the same segments, and each rolls, truncates and sets aside
what the other wrote (a fault campaign lost every acknowledged commit of one of them that way: a
restart racing a process that had not exited yet is enough). The lock is held by an open descriptor,
so the kernel releases it however the process ends, kill -9 included; the descriptor is
close-on-exec, so the sync helper process never holds it.
"""

import errno
import fcntl
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
_HELD = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)


class DirectoryInUse(Exception):
    """Another process holds the directory's lock."""


def lock_directory(directory: Path) -> int | None:
    """The descriptor that holds ``directory``'s lock until it is closed or the process ends;
    DirectoryInUse if another process holds it. None where no first lock file can be made: a
    directory that cannot be written (refused by the caller's own check, with its message), or a full
    disk (a directory made by a kcoord that had none): serving reads beats not starting, unlocked."""
    path = directory / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        writable = True
    except OSError as exc:
        try:  # a read-only descriptor locks as well (a directory that cannot be written is refused later)
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            writable = False
        except FileNotFoundError:
            if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                return None  # nothing can be written there: the caller's write check refuses it, saying so
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                log.warning("%s: cannot create %s (%s): starting without the lock that keeps a second server "
                            "off this directory", directory, LOCK_FILE, exc.strerror)
                return None
            raise exc from None
    _flock(fd, fcntl.LOCK_EX, f"{directory} is in use by another process", path)
    if writable:
        try:  # who holds it, for the next one's message; only a hint
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass
    return fd


def share_directory(directory: Path) -> int | None:
    """A shared hold on ``directory``'s lock, for a reader of its files that must not run beside a
    server (the pipeline: a running kcoord rewrites and removes segments under it) while other readers
    may: the descriptor holds it until closed, and a server cannot start meanwhile. DirectoryInUse if
    a server holds it. The lock file is made if missing (a reshard's output, a copy without it), so a
    server cannot start meanwhile there either; None where it cannot be (a directory that cannot be
    written, where no server can start either, or one that does not exist)."""
    path = directory / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except FileNotFoundError:
        return None
    except OSError:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
    _flock(fd, fcntl.LOCK_SH, f"{directory} is in use by a running kcoord", path)
    return fd


def _flock(fd: int, mode: int, in_use: str, path: Path) -> None:
    """Takes the lock without waiting; closes ``fd`` and raises DirectoryInUse (``in_use``, the holder's
    pid if known, and the lock file ``path``) if another process holds it in a conflicting mode."""
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except OSError as exc:
        holder = _holder(fd)
        os.close(fd)
        if exc.errno in _HELD:
            raise DirectoryInUse(f"{in_use}{holder} (it holds {path})") from None
        raise


def _holder(fd: int) -> str:
    """`` (pid N)`` from the lock file, if that process still runs: the file keeps the pid of the last
    server that held it, and a reader's shared hold writes none."""
    try:
        pid = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""
    if not pid.isdigit():
        return ""
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, OverflowError):
        return ""
    except OSError:  # it runs, as another user
        pass
    return f" (pid {pid})"
