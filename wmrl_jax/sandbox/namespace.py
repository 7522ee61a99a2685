"""The local sandbox's filesystem view and its launcher, host side (see `nslaunch`).

A program of the local backend sees an allowlist, never the host minus a
denylist: read-only binds of the system directories (`SYSTEM_DIRS`) and of
its interpreter (`interpreter.view_paths`), its own work dir, and fresh
/proc, /tmp and /dev/shm. A task tree, the task cache, the trainer's workdir,
other programs' work dirs and /run simply do not exist for it. The one way
grader-side data could still show is by lying inside an allowlisted
directory (a task tree under the interpreter's prefix); `exposed` finds
that, and the executor refuses such an input dir.
"""

import json
import os
import signal
import socket
import time
from typing import NamedTuple

from wmrl_jax.sandbox import nslaunch

# The system's programs, libraries and configuration; never a home, /tmp, /var or /run.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
with open(nslaunch.__file__, encoding="utf-8") as _f:
    LAUNCHER_SOURCE = _f.read()
FAILED = nslaunch.FAILED
# How long a launcher may take to report its program's process (a loaded machine).
HANDSHAKE_S = 60.0


class View(NamedTuple):
    """What a program sees besides its work dir: read-only binds and symbolic links."""

    binds: tuple[str, ...]
    links: dict[str, str]


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def make_view(extra: list[str]) -> View:
    """`SYSTEM_DIRS` and the directories `extra`, nested binds merged into their parents."""
    links, binds = {}, set()
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            links[path] = os.readlink(path)
        elif os.path.isdir(path):
            binds.add(path)
    binds |= {os.path.abspath(p) for p in extra if os.path.isdir(p)}
    # A link's target is bound under its own path; a bind inside another is redundant.
    binds = {b for b in binds if not any(_inside(b, link) for link in links)}
    kept = tuple(sorted(b for b in binds if not any(b != o and _inside(b, o) for o in binds)))
    return View(kept, links)


def exposed(view: View, path: str) -> str | None:
    """The bind through which a program would see `path` (a real path), or None."""
    for bind in view.binds:
        if _inside(path, os.path.realpath(bind)) or _inside(path, bind):
            return bind
    return None


def launcher_argv(python: str, spec: dict) -> list[str]:
    """Runs `nslaunch` with `spec` (its module docstring) under `python`."""
    return [python, "-I", "-S", "-c", LAUNCHER_SOURCE, json.dumps(spec)]


def receive_pidfd(channel: socket.socket, deadline: float) -> int | None:
    """The pidfd of the program's first process sent by the launcher; None if it sent none."""
    channel.settimeout(max(0.1, min(HANDSHAKE_S, deadline - time.monotonic())))
    try:
        _, fds, _, _ = socket.recv_fds(channel, 16, 1)
    except OSError:  # timeout, or the launcher died
        return None
    return fds[0] if fds else None


def pidfd_pid(pidfd: int) -> int | None:
    """The host pid of the process behind `pidfd` (None once it is gone)."""
    try:
        with open(f"/proc/self/fdinfo/{pidfd}") as f:
            for line in f:
                if line.startswith("Pid:"):
                    pid = int(line.split()[1])
                    return pid if pid > 0 else None
    except (OSError, ValueError):
        pass
    return None


def kill_pidfd(pidfd: int) -> None:
    """SIGKILLs the process behind `pidfd`: as pid 1 of its namespace, all the program."""
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except (ProcessLookupError, OSError):
        pass


def describe(view: View, switch_user: bool) -> str:
    """One line: the isolation in force."""
    who = "a uid of its own" if switch_user else "the caller's uid"
    return (
        "LocalExecutor isolation: new user, mount, pid, ipc, net and uts namespaces per "
        f"program, run as {who}; it sees read-only {', '.join(view.binds)}, its work dir, "
        "and private /proc, /tmp, /dev/shm, loopback only. Not isolated: CPU share, "
        "the work dir's size (single files are capped)."
    )
