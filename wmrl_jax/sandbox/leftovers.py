"""Work dirs and processes that a killed trainer left behind, found and removed.

Each run of the local backend marks its work dir with who owns it: the
trainer process and the run's launcher and program processes, each as
(pid, start time), so that a pid reused since names nobody. An executor
starting up removes the dirs of owners that are dead, after killing what
still runs of their programs; a live concurrent trainer's dirs are never
touched, nor dirs without a mark (their owner cannot be proven dead).
"""

import contextlib
import json
import os
import signal
import stat
import tempfile

from wmrl_jax.sandbox.files import remove_tree

PREFIX = "wmrl-local-"
OWNER_FILE = "owner.json"


def start_time(pid: int) -> int | None:
    """The start time of process `pid` (clock ticks since boot), None when there is none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rpartition(b")")[2].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _alive(entry) -> bool:
    pid, start = entry
    return start is not None and start_time(pid) == start


def mark(outer: str, **pids: int | None) -> None:
    """Writes (or rewrites) the owner mark of `outer`: this process and the named `pids`."""
    record = {"owner": [os.getpid(), start_time(os.getpid())]}
    record.update({name: [pid, start_time(pid)] for name, pid in pids.items() if pid})
    tmp = os.path.join(outer, OWNER_FILE + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
    os.replace(tmp, os.path.join(outer, OWNER_FILE))


def _read_mark(outer: str) -> dict | None:
    try:
        fd = os.open(os.path.join(outer, OWNER_FILE), os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd) as f:
            record = json.load(f)
        return {k: (int(v[0]), None if v[1] is None else int(v[1])) for k, v in record.items()}
    except (OSError, ValueError, TypeError, IndexError, AttributeError):
        return None


def remove_stale(directory: str | None = None) -> list[str]:
    """Kills the programs of dead owners' work dirs in `directory` and removes the dirs.

    Args:
        directory: where work dirs are made; default the temp dir.

    Returns:
        The dirs removed.
    """
    directory = directory or tempfile.gettempdir()
    removed = []
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for entry in entries:
            if not entry.name.startswith(PREFIX):
                continue
            with contextlib.suppress(OSError):
                info = entry.stat(follow_symlinks=False)
                if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
                    continue
                record = _read_mark(entry.path)
                if record is None or "owner" not in record or _alive(record["owner"]):
                    continue
                # The program first: as pid 1 of its namespace, its death ends all of it.
                for name in ("program", "launcher"):
                    if name in record and _alive(record[name]):
                        with contextlib.suppress(OSError):
                            os.kill(record[name][0], signal.SIGKILL)
                remove_tree(entry.path)
                removed.append(entry.path)
    return removed
