"""A stopped trainer's local programs: close(), interpreter exit and the next executor's start."""

import glob
import os
import subprocess
import sys
import tempfile
import textwrap
import time

from tests.sandbox.conftest import local_executor

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Runs the program in argv[1] on a LocalExecutor; waits for it (argv[2] "wait", killed by
# the test meanwhile) or exits once the file argv[2] exists, leaving it running.
TRAINER = """
import os, sys, time, warnings
warnings.simplefilter("ignore")
from wmrl_jax.sandbox import LocalExecutor
ex = LocalExecutor(python=sys.executable, timeout_s=600)
future = ex.submit(sys.argv[1])
if sys.argv[2] == "wait":
    future.result()
while not os.path.exists(sys.argv[2]):
    time.sleep(0.02)
"""


def program(token: str, *, clear_parent_death: bool) -> str:
    """Marks its work dir with `token`, then sleeps with `token` in its argv."""
    clear = "ctypes.CDLL(None).prctl(1, 0, 0, 0, 0)" if clear_parent_death else ""
    return textwrap.dedent(
        f"""
        import ctypes, os, sys
        {clear}
        open("output/started", "w").write({token!r})
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)", {token!r}])
        """
    )


def wait_for(predicate, what: str, limit_s: float = 120.0):
    """Polls `predicate` until it returns a truthy value; fails after `limit_s` (a hang guard)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise AssertionError(f"never saw {what}")


def outer_dir(token: str) -> str | None:
    for path in glob.glob(os.path.join(tempfile.gettempdir(), "wmrl-local-*")):
        try:
            with open(os.path.join(path, "work", "output", "started")) as f:
                if f.read() == token:
                    return path
        except OSError:
            pass
    return None


def sleeper(token: str) -> int | None:
    """The live (non-zombie) host process whose argv holds `token`."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"time.sleep(600)\0" + token.encode() not in f.read():  # not the trainer
                    continue
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().rpartition(b")")[2].split()[0] != b"Z":
                    return int(pid)
        except OSError:
            pass
    return None


def new_token() -> str:
    return f"wmrl-leftover-{os.getpid()}-{os.urandom(4).hex()}"


def test_next_executor_kills_a_killed_trainers_program_and_removes_its_dir():
    token = new_token()
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, program(token, clear_parent_death=True), "wait"],
        env={**os.environ, "PYTHONPATH": REPO},
    )
    try:
        outer = wait_for(lambda: outer_dir(token), "the program's work dir")
        pid = wait_for(lambda: sleeper(token), "the program")
    finally:
        trainer.kill()
        trainer.wait()
    assert sleeper(token) == pid  # orphaned: it outlived its trainer
    local_executor(timeout_s=30).close()
    assert not os.path.exists(outer)
    wait_for(lambda: sleeper(token) is None, "the program's end", limit_s=30)


def test_close_kills_running_programs_and_removes_their_work_dirs():
    token = new_token()
    ex = local_executor(timeout_s=600)
    future = ex.submit(program(token, clear_parent_death=True))
    outer = wait_for(lambda: outer_dir(token), "the program's work dir")
    ex.close()
    result = future.result()
    assert result.status == "infra_error" and "closed" in result.message, result
    assert not os.path.exists(outer)
    assert sleeper(token) is None


def test_interpreter_exit_kills_running_programs(tmp_path):
    token, go = new_token(), str(tmp_path / "go")
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, program(token, clear_parent_death=True), go],
        env={**os.environ, "PYTHONPATH": REPO},
    )
    try:
        outer = wait_for(lambda: outer_dir(token), "the program's work dir")
        open(go, "w").close()  # the trainer's main thread ends with its program running
        # A hang guard, not a speed check: without the exit hook this waits 600 s.
        assert trainer.wait(timeout=300) == 0
    finally:
        trainer.kill()
    assert not os.path.exists(outer)
    assert sleeper(token) is None


def test_a_live_trainers_work_dir_is_left_alone():
    token = new_token()
    with local_executor(timeout_s=600) as ex:
        future = ex.submit(program(token, clear_parent_death=False))
        outer = wait_for(lambda: outer_dir(token), "the program's work dir")
        local_executor(timeout_s=30).close()  # a second executor starting beside it
        assert os.path.exists(outer) and sleeper(token) is not None
    assert future.result().status == "infra_error"
