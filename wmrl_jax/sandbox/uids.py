"""Per-program user ids of the local sandbox (as root): slots, locks, and killing what a uid runs.

A slot is a uid in [UID_BASE, UID_BASE + UID_SLOTS) held through an flock on
a file of a root-only directory, so that no two runs (in any process of the
machine) share a uid. Everything a uid still runs is killed when its slot is
taken and after each program, and `reap_free_slots` clears the slots that no
live run holds (a killed trainer's) at start-up.
"""

import contextlib
import fcntl
import os
import stat
import subprocess
import tempfile
import time

from wmrl_jax.sandbox.interpreter import Interpreter

UID_BASE = 61000
UID_SLOTS = 256
# Fixed at import: every process of this machine must agree on it.
_UID_LOCK_DIR = os.path.join(tempfile.gettempdir(), "wmrl-sandbox-uids")


def uid_processes(uid: int) -> list[int]:
    """Live (non-zombie) processes whose /proc entry belongs to `uid`."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            with open(f"/proc/{name}/stat", "rb") as f:
                if f.read().rpartition(b")")[2].split()[0] != b"Z":
                    pids.append(int(name))
        except (OSError, IndexError):
            continue
    return pids


def kill_uid(uid: int, interpreter: Interpreter) -> bool:
    """SIGKILLs every process of `uid`; True when none is left."""
    for _ in range(50):
        if not uid_processes(uid):
            return True
        # kill(-1) as `uid` reaches exactly that uid's processes, atomically. A
        # fresh interpreter rather than os.fork(): this process may have threads.
        subprocess.run(
            [
                interpreter.executable,
                "-I",
                "-S",
                "-c",
                "import os\ntry: os.kill(-1, 9)\nexcept OSError: pass",
            ],
            user=uid,
            group=uid,
            extra_groups=[],
            env={"PATH": "/usr/bin:/bin", **interpreter.env},
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        time.sleep(0.005)
    return not uid_processes(uid)


def _lock_dir() -> str:
    lock_dir = _UID_LOCK_DIR
    os.makedirs(lock_dir, mode=0o700, exist_ok=True)
    info = os.lstat(lock_dir)  # a program may have made this path first, as itself or a link
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise PermissionError(f"{lock_dir} is not a private directory of uid {os.geteuid()}")
    return lock_dir


def _try_slot(uid: int) -> int | None:
    """A descriptor holding `uid`'s lock, or None when another run holds it."""
    path = os.path.join(_lock_dir(), str(uid))
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


@contextlib.contextmanager
def uid_slot(interpreter: Interpreter):
    """A user id no other run (in any process) uses at the same time."""
    start = os.getpid() % UID_SLOTS
    for i in range(UID_SLOTS):
        uid = UID_BASE + (start + i) % UID_SLOTS
        if (fd := _try_slot(uid)) is None:
            continue
        try:
            kill_uid(uid, interpreter)  # a previous owner that crashed may have left processes
            yield uid
        finally:
            os.close(fd)
        return
    raise RuntimeError(f"all {UID_SLOTS} sandbox user ids are busy")


def reap_free_slots(interpreter: Interpreter) -> None:
    """Kills what runs under slot uids that no live run holds (a killed trainer's)."""
    uids = set()
    for name in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            if name.isdigit() and UID_BASE <= (uid := os.stat(f"/proc/{name}").st_uid):
                if uid < UID_BASE + UID_SLOTS:
                    uids.add(uid)
    for uid in sorted(uids):
        if (fd := _try_slot(uid)) is not None:
            try:
                kill_uid(uid, interpreter)
            finally:
                os.close(fd)
