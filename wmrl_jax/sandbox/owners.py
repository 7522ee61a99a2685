"""Who owns a sandbox container, and removing those whose owner is gone.

Every container a `DockerExecutor` creates carries labels naming its owner
process (host name, boot id, pid and the process's start time, which together
tell a live process from a later one that reuses its pid) and the wall-clock
time at which the container ends itself (its main process is a `sleep` of the
run's timeout plus a grace). An executor that starts removes the containers of
owners that are dead, so that what a SIGKILLed trainer or a dead Ray actor left
does not pile up:

- owner on this host (same host name and boot id): removed when that process
  no longer runs (no such pid, or a pid started at another time); a live
  owner's containers are never touched, whatever their age;
- owner on another host, or on this host before a reboot (an engine shared
  through DOCKER_HOST, a restarted pod): its liveness cannot be checked, so
  its containers are removed only once their own deadline is `FOREIGN_MARGIN_S`
  past, when every owner has finished with them;
- containers without owner labels (made by an earlier version): kept, logged.

`remove_at_exit` removes an executor's containers when the interpreter exits,
before thread pools are joined (which would wait for every running program).
"""

import atexit
import concurrent.futures.thread  # noqa: F401  (its exit hook, joining pools, goes before ours)
import functools
import logging
import os
import socket
import threading
import time
import weakref

log = logging.getLogger(__name__)

LABEL = "wmrl-sandbox"  # value: the executor's token
HOST_LABEL = f"{LABEL}.host"
BOOT_LABEL = f"{LABEL}.boot"
PID_LABEL = f"{LABEL}.pid"
STARTED_LABEL = f"{LABEL}.started"  # the owner's start time, in clock ticks since boot
DEADLINE_LABEL = f"{LABEL}.deadline"  # unix time by which the container has ended itself
# Host clocks differ; a foreign container is left alone this long past its deadline.
FOREIGN_MARGIN_S = 600.0


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def process_start(pid: int) -> str | None:
    """The start time of process `pid` (clock ticks since boot, as a string), or None
    when no such process runs. Where /proc is missing, "" for any process that exists."""
    stat = _read(f"/proc/{pid}/stat")
    if stat:  # the name (field 2) may hold spaces and parentheses: split after the last ')'
        return stat.rpartition(")")[2].split()[19]
    if os.path.isdir("/proc/self"):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return ""


@functools.cache
def _host() -> tuple[str, str]:
    return socket.gethostname(), _read("/proc/sys/kernel/random/boot_id")


def owner_labels(token: str, deadline: float) -> dict[str, str]:
    """The labels of a container of this process that ends itself by `deadline` (unix time)."""
    host, boot = _host()
    pid = os.getpid()
    return {
        LABEL: token,
        HOST_LABEL: host,
        BOOT_LABEL: boot,
        PID_LABEL: str(pid),
        STARTED_LABEL: process_start(pid) or "",
        DEADLINE_LABEL: f"{deadline:.0f}",
    }


def owner_is_gone(labels: dict[str, str], now: float | None = None) -> bool | None:
    """Whether the owner of a container with `labels` has finished with it; None: unknown
    (no owner labels)."""
    if PID_LABEL not in labels or DEADLINE_LABEL not in labels:
        return None
    if (labels.get(HOST_LABEL), labels.get(BOOT_LABEL)) == _host():
        try:
            return process_start(int(labels[PID_LABEL])) != labels.get(STARTED_LABEL)
        except ValueError:
            return None
    try:
        deadline = float(labels[DEADLINE_LABEL])
    except ValueError:
        return None
    return (time.time() if now is None else now) > deadline + FOREIGN_MARGIN_S


def already_removed(error: Exception) -> bool:
    """Whether a failed removal means the container is gone or going (another thread's)."""
    status = getattr(error, "status_code", None)
    return status == 404 or (status == 409 and "already in progress" in str(error))


def reap(client) -> list[str]:
    """Removes the sandbox containers whose owner is gone (see the module docstring);
    returns their ids. Engine failures are logged, never raised."""
    try:
        listed = client.api.containers(all=True, filters={"label": LABEL})
    except Exception as e:
        log.warning("could not list sandbox containers to remove leftovers: %s", e)
        return []
    removed, legacy = [], 0
    for entry in listed:
        gone = owner_is_gone(entry.get("Labels") or {})
        if gone is None:
            legacy += 1
        if not gone:
            continue
        try:
            client.api.remove_container(entry["Id"], force=True)
            removed.append(entry["Id"])
        except Exception as e:
            if not already_removed(e):  # its owner may remove it meanwhile
                log.warning("could not remove leftover container %s: %s", entry["Id"][:12], e)
    if removed:
        log.info("removed %d sandbox container(s) left by dead owners", len(removed))
    if legacy:
        log.warning(
            "%d sandbox container(s) carry no owner labels (an earlier version made them); "
            "remove them with `docker rm -f $(docker ps -aq --filter label=%s)` once no "
            "trainer runs",
            legacy,
            LABEL,
        )
    return removed


# Executors whose containers go at interpreter exit.
_AT_EXIT: weakref.WeakSet = weakref.WeakSet()


def remove_at_exit(executor) -> None:
    """Calls `executor.remove_containers()` when the interpreter exits (held weakly)."""
    _AT_EXIT.add(executor)


def _remove_all() -> None:
    for executor in list(_AT_EXIT):
        executor._closing = True  # the runs still in flight end as "closed"
        try:
            executor.remove_containers()
        except Exception as e:  # the exit goes on
            log.warning("could not remove the containers of an executor at exit: %s", e)


# Before thread pools are joined where the interpreter allows it, else with the
# ordinary atexit hooks (after them).
try:
    threading._register_atexit(_remove_all)
except Exception:  # no such hook, or the interpreter is already exiting
    atexit.register(_remove_all)
