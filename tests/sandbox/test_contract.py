"""The ExecutionResult contract, its helpers, and errors that say how to fix them."""

import os
import re
import subprocess
import warnings

import pytest

from tests.sandbox.conftest import ENGINE_SCRIPT, local_executor
from wmrl_jax.sandbox import (
    STATUSES,
    DockerExecutor,
    ExecutionResult,
    Executor,
    InfraError,
    LocalExecutor,
    WeakIsolationWarning,
    make_executor,
)
from wmrl_jax.sandbox.files import read_output
from wmrl_jax.sandbox.image import default_image, image_version
from wmrl_jax.sandbox.result import MAX_TIMEOUT_S, TailBuffer, check_files, check_timeout


def test_statuses_are_the_six_strings():
    assert STATUSES == ("ok", "error", "timeout", "oom", "killed", "infra_error")
    for status in STATUSES:
        assert ExecutionResult(status=status).status == status
    with pytest.raises(ValueError, match="status must be one of"):
        ExecutionResult(status="invalid-output")


def test_tail_buffer_keeps_the_last_bytes():
    buf = TailBuffer(5)
    for piece in (b"ab", b"cdef", b"g"):
        buf.write(piece)
    assert (buf.text(), buf.total, buf.truncated) == ("cdefg", 7, True)
    buf.write(b"0123456789")
    assert buf.text() == "56789"
    small = TailBuffer(10)
    small.write(b"hi")
    assert (small.text(), small.truncated) == ("hi", False)


def test_check_files_rejects_paths_outside_the_work_dir():
    assert check_files({"a/b.py": "x"}) == {"a/b.py": b"x"}
    for bad in ("/etc/passwd", "../x", "a/../../x", "main.py", "output/x", "input/y", ""):
        with pytest.raises(ValueError):
            check_files({bad: b""})


def test_read_output_caps_and_skips_links(tmp_path):
    out = tmp_path / "output"
    out.mkdir()
    (out / "a.txt").write_bytes(b"12345")
    (out / "big.bin").write_bytes(b"x" * 100)
    (out / "link").symlink_to("/etc/passwd")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        files, dropped = read_output(fd, "output", max_bytes=50)
    finally:
        os.close(fd)
    assert files == {"a.txt": b"12345"}
    assert sorted(d.split()[0] for d in dropped) == ["big.bin", "link"]


def test_local_states_its_isolation_at_start_up():
    with pytest.warns(WeakIsolationWarning, match="isolation: new user, mount, pid, ipc, net"):
        LocalExecutor().close()
    assert "namespaces" in LocalExecutor.__doc__


def test_both_backends_satisfy_the_protocol(docker_executor):
    assert isinstance(local_executor(), Executor)
    assert isinstance(docker_executor, Executor)


def test_local_submit_returns_a_future():
    with local_executor() as ex:
        future = ex.submit("print('async')", timeout_s=30)
        assert future.result(timeout=60).stdout == "async\n"


def test_no_engine_raises_with_a_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    with pytest.raises(InfraError, match="launch/docker_engine.sh start"):
        DockerExecutor()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", WeakIsolationWarning)
        assert isinstance(make_executor(timeout_s=5), LocalExecutor)


def test_missing_image_raises_with_the_build_command(docker_available):
    with pytest.raises(InfraError, match=r"python -m wmrl_jax\.sandbox\.image"):
        DockerExecutor("wmrl-sandbox:does-not-exist")


def test_image_tag_names_the_recipe():
    assert re.fullmatch(r"wmrl-sandbox:\d+\.\d+\.\d+-[0-9a-f]{8}", default_image())
    assert default_image().endswith(image_version())
    out = subprocess.run(
        ["python", "-m", "wmrl_jax.sandbox.image", "--print"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PATH": os.path.dirname(os.sys.executable) + ":" + os.environ["PATH"]},
    ).stdout
    assert out.strip() == default_image()


def test_engine_script_usage_and_status(docker_available):
    assert subprocess.run([ENGINE_SCRIPT, "bogus"], capture_output=True).returncode == 2
    status = subprocess.run([ENGINE_SCRIPT, "status"], capture_output=True, text=True)
    assert status.returncode == 0 and "answering" in status.stdout
    # Idempotent: starting a running engine does nothing.
    again = subprocess.run([ENGINE_SCRIPT, "start"], capture_output=True, text=True)
    assert again.returncode == 0 and "already" in again.stdout


def test_missing_input_dir_is_a_caller_error(tmp_path):
    with local_executor() as ex, pytest.raises(ValueError, match="not a directory"):
        ex.run("pass", input_dir=tmp_path / "absent")


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), 0, -1, "10", True])
def test_impossible_timeouts_are_refused(timeout):
    with pytest.raises(ValueError, match="timeout_s"):
        local_executor(timeout_s=timeout)
    ex = local_executor(timeout_s=10)
    with pytest.raises(ValueError, match="timeout_s"):
        ex.run("print(1)", timeout_s=timeout)


@pytest.mark.parametrize("value", [MAX_TIMEOUT_S * 1.01, 2.2e6 * 10, 1e9, 1e300])
def test_timeout_above_the_maximum_is_refused(value):
    with pytest.raises(ValueError, match=r"timeout_s must be at most 604800 s"):
        check_timeout(value)


def test_the_largest_timeout_runs_locally():
    # 7 days, and each wait on the pipes stays below epoll's 2**31 ms (~24.8 days).
    assert check_timeout(MAX_TIMEOUT_S) == MAX_TIMEOUT_S < 2**31 / 1000
    with local_executor(timeout_s=MAX_TIMEOUT_S) as ex:
        result = ex.run("print('fine')")
    assert (result.status, result.stdout) == ("ok", "fine\n"), result


def test_local_pipe_wait_takes_a_deadline_past_epolls_range():
    # The cause of the old failure: epoll's timeout in ms is a C int (OverflowError past 2**31 ms).
    import selectors
    import time

    from wmrl_jax.sandbox.local import LocalExecutor as Local

    r, w = os.pipe()
    os.write(w, b"x")
    os.close(w)
    buffer = TailBuffer(16)
    with os.fdopen(r, "rb") as stream, selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ, buffer)
        timed_out = Local._pump(sel, deadline=time.monotonic() + 3e6, until_exit=False)
    assert (timed_out, buffer.text()) == (False, "x")
