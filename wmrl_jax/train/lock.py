"""One trainer per workdir: an exclusive lock held for the run.

Two trainers on one workdir would both pass the resume guard, write the same
checkpoints and metrics, and one run's results would be lost without a word.
`WorkdirLock.acquire` takes an exclusive `fcntl.flock` on `<workdir>/.lock`
(and writes the holder's pid there, for the message); a second trainer fails at
once with `WorkdirBusy` naming the workdir and the holder. The kernel drops the
lock when its file is closed: on `release`, and on any exit of the process,
`kill -9` included, so a stale lock never blocks a later run.

Example:
    >>> lock = WorkdirLock.acquire(workdir)
    >>> try:
    ...     run()
    ... finally:
    ...     lock.release()
"""

from __future__ import annotations

import errno
import fcntl
import os

__all__ = ["LOCK_FILE", "WorkdirBusy", "WorkdirLock"]

LOCK_FILE = ".lock"


class WorkdirBusy(RuntimeError):
    """Another trainer holds the workdir's lock."""


class WorkdirLock:
    """An exclusive lock on a workdir, held from `acquire` to `release`."""

    def __init__(self, path: str, fd: int):
        self.path, self._fd = path, fd

    @classmethod
    def acquire(cls, workdir: str) -> WorkdirLock:
        """Locks `workdir` (which must exist) or raises `WorkdirBusy` without waiting."""
        path = os.path.join(workdir, LOCK_FILE)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _holder(fd)
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise WorkdirBusy(
                f"--workdir {workdir!r} is in use by another trainer (pid {holder}); wait for "
                "it to end or stop it, or use another workdir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return cls(path, fd)

    def release(self) -> None:
        """Drops the lock (idempotent); the file stays, empty of meaning once unlocked."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # Closing the file releases the flock.

    @property
    def held(self) -> bool:
        return self._fd is not None


def _holder(fd: int) -> str:
    """The pid the holder wrote into the lock file, or "unknown"."""
    try:
        text = os.pread(fd, 64, 0).decode(errors="replace").strip()
    except OSError:
        return "unknown"
    return text if text.isdigit() else "unknown"
