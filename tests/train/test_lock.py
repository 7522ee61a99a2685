"""One trainer per workdir: the lock, from another process and from another Trainer."""

import os
import subprocess
import sys

import pytest

from wmrl_jax.train.lock import WorkdirBusy, WorkdirLock

# Holds the lock of the workdir argv[1] until its stdin closes.
_HOLDER = """
import sys
from wmrl_jax.train.lock import WorkdirLock
lock = WorkdirLock.acquire(sys.argv[1])
print("held", flush=True)
sys.stdin.read()
"""


def test_a_second_holder_fails_at_once_naming_the_first_pid(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(tmp_path)], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(WorkdirBusy, match=rf"{tmp_path}.*in use.*\(pid {holder.pid}\)"):
            WorkdirLock.acquire(str(tmp_path))
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    # The holder is gone (the kernel dropped its lock): the workdir is free again.
    lock = WorkdirLock.acquire(str(tmp_path))
    assert lock.held
    lock.release()
    lock.release()  # idempotent
    assert not lock.held


def test_two_locks_in_one_process_exclude_each_other(tmp_path):
    first = WorkdirLock.acquire(str(tmp_path))
    with pytest.raises(WorkdirBusy, match=rf"pid {os.getpid()}"):
        WorkdirLock.acquire(str(tmp_path))
    first.release()
    WorkdirLock.acquire(str(tmp_path)).release()
