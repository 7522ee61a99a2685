"""Hostile programs against both backends: right status, nothing harmed, nothing left.

Network tests touch loopback addresses only (127.0.0.0/8 and ::1).
"""

import os
import resource
import socket
import textwrap
import time

import pytest

from tests.sandbox.conftest import TEST_LIMITS
from wmrl_jax.sandbox import STATUSES, container_io

MiB = 1 << 20


def run(executor, source, **kwargs):
    result = executor.run(textwrap.dedent(source), **kwargs)
    assert result.status in STATUSES
    return result


def live_processes_with(token: str) -> list[int]:
    """Host processes (not zombies) whose argv holds `token`; containers' included."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if token.encode() not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().rpartition(b")")[2].split()[0] != b"Z":
                    found.append(int(pid))
        except OSError:
            pass
    return found


def assert_gone(token: str) -> None:
    """No process with `token` in its argv is left (killed ones may take a moment to exit)."""
    deadline = time.monotonic() + 30  # a hang guard, not a speed check
    while left := live_processes_with(token):
        assert time.monotonic() < deadline, f"processes {left} outlived the run"
        time.sleep(0.05)


def assert_healthy(executor):
    """The next program is unaffected."""
    result = run(executor, "print(6 * 7)", timeout_s=30)
    assert (result.status, result.stdout) == ("ok", "42\n"), result


def test_ok_program_and_output_files(executor, tmp_path):
    (tmp_path / "data.txt").write_text("3")
    result = run(
        executor,
        """
        import os, helper
        n = int(open("input/data.txt").read())
        os.makedirs("output/sub", exist_ok=True)
        open("output/sub/answer.txt", "w").write(str(helper.twice(n)))
        print("done", os.environ["WMRL_INPUT_DIR"].endswith("input"))
        """,
        input_dir=tmp_path,
        files={"helper.py": "def twice(x):\n    return 2 * x\n"},
    )
    assert result.status == "ok", result
    assert result.exit_code == 0
    assert result.stdout == "done True\n"
    assert result.files == {"sub/answer.txt": b"6"}
    assert result.wall_seconds > 0
    assert result.cpu_seconds is None or result.cpu_seconds >= 0


def test_error_is_a_result(executor):
    result = run(executor, "raise SystemExit(3)")
    assert (result.status, result.exit_code) == ("error", 3)
    result = run(executor, "1 / 0")
    assert result.status == "error" and "ZeroDivisionError" in result.stderr


def test_input_is_read_only(executor, tmp_path):
    (tmp_path / "train.csv").write_text("a,b\n")
    result = run(
        executor,
        """
        for attempt in (lambda: open("input/train.csv", "w"), lambda: open("input/new", "w")):
            try:
                attempt()
                print("wrote")
            except OSError as e:
                print("denied", type(e).__name__)
        """,
        input_dir=tmp_path,
    )
    assert result.status == "ok" and "wrote" not in result.stdout, result
    assert (tmp_path / "train.csv").read_text() == "a,b\n"
    assert sorted(os.listdir(tmp_path)) == ["train.csv"]


def test_infinite_loop_times_out(executor):
    start = time.monotonic()
    result = run(executor, "while True:\n    pass\n", timeout_s=1.0)
    assert result.status == "timeout"
    # Kept: the timeout's contract (a 1 s timeout ends the run), with a 60x margin for load.
    assert time.monotonic() - start < 60
    assert_healthy(executor)


def test_memory_hog_is_oom(executor):
    result = run(executor, "x = bytearray(2 << 30)\nprint('survived')")
    assert result.status == "oom", result
    assert "survived" not in result.stdout
    assert_healthy(executor)


def test_fork_bomb_is_contained(executor):
    if executor.environment.startswith("local") and os.geteuid() != 0:
        pytest.skip("RLIMIT_NPROC would count all of this user's processes; not risking it")
    token = f"wmrl-bomb-{os.getpid()}-{time.monotonic_ns()}"
    result = run(
        executor,
        f"""
        import os, sys
        if len(sys.argv) < 2:  # every copy carries the token in its argv
            os.execv(sys.executable, [sys.executable, "main.py", {token!r}])
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """,
        timeout_s=3.0,
    )
    # "oom" too: copies of the interpreter can fill the memory cap before the pids cap.
    assert result.status in ("timeout", "killed", "error", "oom"), result
    assert_gone(token)  # every copy is gone, none escaped the kill
    assert_healthy(executor)


@pytest.mark.parametrize("grace_s", [0.0, None], ids=["stopped", "drained"])
def test_program_that_kills_its_wrapper_is_killed_not_infra(executor, monkeypatch, grace_s):
    """The fork bomb's rare outcome, made certain: the wrapper dies before the
    program, whose processes then hold the output stream past the exec's end."""
    if executor.environment.startswith("local"):
        pytest.skip("the local backend has no wrapper; the program's parent is the caller")
    from wmrl_jax.sandbox import docker_backend

    if grace_s is not None:  # the stream still open when the grace ends: stop the container
        monkeypatch.setattr(docker_backend, "STREAM_GRACE_S", grace_s)
    result = run(
        executor,
        """
        import os, time
        print("started", flush=True)
        time.sleep(0.5)
        os.kill(os.getppid(), 9)
        time.sleep(60)
        """,
        # Headroom for a loaded machine: the wrapper dies ~0.5 s after start, long before.
        timeout_s=8.0 if grace_s is not None else 20.0,
    )
    # "killed", not "timeout": the run ended with the wrapper, not at its timeout.
    assert (result.status, result.exit_code) == ("killed", -9), result
    assert result.stdout == "started\n"
    assert_healthy(executor)


def test_stdout_flood_is_truncated_not_buffered(executor):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result = run(
        executor,
        """
        import sys
        chunk = "x" * (1 << 20)
        for _ in range(100):
            sys.stdout.write(chunk)
        sys.stdout.write("THE END")
        """,
        timeout_s=60,
    )
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    assert result.status == "ok", result
    assert result.stdout_truncated and result.stdout.endswith("THE END")
    assert len(result.stdout) <= TEST_LIMITS.tail_bytes
    assert grown < 50 * MiB


def test_closed_stdout_then_sleep_times_out(executor):
    result = run(
        executor, "import os, time\nos.close(1)\nos.close(2)\ntime.sleep(60)", timeout_s=1.0
    )
    assert result.status == "timeout"
    assert_healthy(executor)


def test_orphaned_child_is_killed(executor):
    result = run(
        executor,
        """
        import os, time
        pid = os.fork()
        if pid == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(120)
            os._exit(0)
        os.waitpid(pid, 0)
        print(os.getpid())
        """,
        timeout_s=20,
    )
    # "ok", not "timeout": the run did not wait for the orphan (it sleeps past the timeout).
    assert result.status == "ok", result
    assert_healthy(executor)


def test_orphan_gone_on_host_local():
    from tests.sandbox.conftest import local_executor

    if os.geteuid() != 0:
        pytest.skip("without root a descendant that calls setsid() can escape (documented)")

    with local_executor(timeout_s=20) as ex:
        result = ex.run(
            textwrap.dedent(
                """
                import os, time
                pid = os.fork()
                if pid == 0:
                    os.setsid()
                    time.sleep(120)
                else:
                    print(pid, flush=True)
                """
            )
        )
    assert result.status == "ok", result
    pid = int(result.stdout.split()[0])
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # dead: gone, or a zombie until init reaps it
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                state = f.read().rpartition(b")")[2].split()[0]
            owner = os.stat(f"/proc/{pid}").st_uid
        except FileNotFoundError:
            break
        if state == b"Z" or owner == os.getuid():  # a zombie, or the pid was reused by us
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"orphan {pid} still runs")


def test_writing_outside_the_work_dir(executor, tmp_path):
    token = f"wmrl-evil-{os.getpid()}-{time.monotonic_ns()}"
    targets = [
        "/etc/" + token,
        "/usr/" + token,
        "/" + token,
        f"/tmp/{token}",
        str(tmp_path / token),
    ]
    result = run(
        executor,
        f"""
        for path in {targets!r}:
            try:
                open(path, "w").write("x")
                print("wrote", path)
            except OSError:
                pass
        """,
    )
    assert result.status == "ok", result
    for path in targets:
        assert not os.path.exists(path), f"{path} exists on the host"
    if executor.environment.startswith("docker"):
        assert "wrote" not in result.stdout.replace(f"wrote /tmp/{token}", "")


def test_filling_work_dir_and_tmp(executor):
    result = run(
        executor,
        """
        import os, tempfile
        for where in (".", tempfile.gettempdir()):
            written = 0
            try:
                with open(os.path.join(where, "fill"), "wb") as f:
                    while written < (1 << 30):
                        f.write(b"\\0" * (1 << 20))
                        f.flush()
                        written += 1 << 20
            except OSError as e:
                print(where, written >> 20, type(e).__name__)
            finally:
                try:
                    os.remove(os.path.join(where, "fill"))
                except OSError:
                    pass
        """,
        timeout_s=60,
    )
    assert result.status in ("ok", "oom"), result
    for line in result.stdout.splitlines():
        assert (
            int(line.split()[1]) <= max(TEST_LIMITS.work_bytes, TEST_LIMITS.file_size_bytes) >> 20
        )
    assert len(result.stdout.splitlines()) == 2, result
    assert_healthy(executor)


def test_host_secrets_unreadable(executor, tmp_path):
    if executor.environment.startswith("local") and os.geteuid() != 0:
        pytest.skip("without root the local program runs as the caller and can read its files")
    public = tmp_path / "public"
    public.mkdir()
    (public / "train.csv").write_text("x\n1\n")
    answers = tmp_path / "private_answers.csv"  # next to the inputs, never mounted
    answers.write_text("SECRET-ANSWER-1234")
    answers.chmod(0o600)
    result = run(
        executor,
        f"""
        for path in ("/etc/shadow", {str(answers)!r}, "input/../private_answers.csv"):
            try:
                print(open(path).read())
            except OSError as e:
                print("denied", path, type(e).__name__)
        """,
        input_dir=public,
    )
    assert result.status == "ok", result
    assert "SECRET-ANSWER" not in result.stdout
    assert "root:" not in result.stdout


def test_output_symlink_to_host_path_is_not_followed(executor):
    result = run(
        executor,
        """
        import os
        os.symlink("/etc/passwd", "output/passwd")
        os.symlink("/etc", "output/etc")
        open("output/real.txt", "w").write("fine")
        """,
    )
    assert result.status == "ok", result
    assert result.files == {"real.txt": b"fine"}
    assert "passwd" in result.message and "etc" in result.message


def test_network_is_loopback_only_in_docker(docker_executor):
    # A server on the host's loopback; the container must not reach it.
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    try:
        result = docker_executor.run(
            textwrap.dedent(
                f"""
                import socket
                ifaces = [l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:]]
                routes = open("/proc/net/route").readlines()[1:]
                print("ifaces", ifaces, "routes", len(routes))
                for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
                    s = socket.socket(family, socket.SOCK_STREAM)
                    s.settimeout(2)
                    try:
                        s.connect((host, {port}))
                        print("connected", host)
                    except OSError as e:
                        print("refused", host, type(e).__name__)
                # Only asked with no route out: nothing can leave the container.
                if not routes and ifaces == ["lo"]:
                    try:
                        socket.getaddrinfo("sandbox-test.invalid", 80)
                        print("resolved")
                    except OSError as e:
                        print("dns failed", type(e).__name__)
                """
            ),
            timeout_s=30,
        )
        with pytest.raises(TimeoutError):
            server.accept()
    finally:
        server.close()
    assert result.status == "ok", result
    assert "ifaces ['lo'] routes 0" in result.stdout
    assert "connected" not in result.stdout
    assert "dns failed" in result.stdout


def test_image_has_pinned_libraries(docker_executor):
    from wmrl_jax.sandbox.image import WHEELS

    result = docker_executor.run(
        "import numpy, pandas, scipy, sklearn\n"
        "for m in (numpy, pandas, scipy, sklearn): print(m.__name__, m.__version__)",
        timeout_s=60,
    )
    assert result.status == "ok", result
    pins = dict(w.split("==") for w in WHEELS)
    versions = dict(line.split() for line in result.stdout.splitlines())
    assert versions == {
        "numpy": pins["numpy"],
        "pandas": pins["pandas"],
        "scipy": pins["scipy"],
        "sklearn": pins["scikit-learn"],
    }


def test_docker_reports_resources(docker_executor):
    result = docker_executor.run("x = bytearray(100 << 20)\nsum(range(10**6))")
    assert result.status == "ok", result
    if result.peak_memory_bytes is not None:  # measurable when the engine is on this host
        assert result.peak_memory_bytes >= 100 << 20
        assert result.cpu_seconds > 0


def test_nothing_left_in_the_temp_dir(executor, tmp_path, monkeypatch):
    import tempfile

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    for source in ("print(1)", "while True: pass", "import os\nos.symlink('/etc', 'output/x')"):
        run(executor, source, timeout_s=1.0)
    assert os.listdir(scratch) == []


def test_a_late_start_of_the_exec_is_not_its_end(docker_executor, monkeypatch):
    # The reader thread starts the exec; on a busy machine the first polls come
    # before that. A busy loop must still end as "timeout", an ok program as "ok".
    consume = container_io.OutputStream._consume

    def late(self, api, exec_id):
        time.sleep(0.3)
        consume(self, api, exec_id)

    monkeypatch.setattr(container_io.OutputStream, "_consume", late)
    result = run(docker_executor, "while True:\n    pass\n", timeout_s=1.0)
    assert result.status == "timeout", result
    assert_healthy(docker_executor)


def test_interrupted_caller_leaves_no_container(docker_executor, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(docker_executor, "_execute", interrupted)
    with pytest.raises(KeyboardInterrupt):
        docker_executor.run("print(1)")
    assert not docker_executor._live
    # The fixture checks that no container with this executor's label is left.


def test_docker_isolation_settings(docker_executor):
    config = docker_executor._host_config(None, "/nonexistent")
    assert config["network_mode"] == "none"
    assert config["mem_limit"] == config["memswap_limit"] == TEST_LIMITS.memory_bytes
    assert config["pids_limit"] == TEST_LIMITS.pids and config["nano_cpus"] == 10**9
    assert config["read_only"] and config["init"]
    assert config["cap_drop"] == ["ALL"] and config["security_opt"] == ["no-new-privileges"]
    assert set(config["tmpfs"]) == {"/tmp", "/work"}
    assert all("size=" in options for options in config["tmpfs"].values())
    result = docker_executor.run(
        "import os\n"
        "status = dict(l.split(':', 1) for l in open('/proc/self/status'))\n"
        "print(os.getuid(), os.getgid(), status['CapEff'].strip(), status['NoNewPrivs'].strip())\n"
        "print(open('/proc/1/cmdline').read().split(chr(0))[0])"
    )
    assert result.status == "ok", result
    ids_caps, init = result.stdout.splitlines()
    assert ids_caps == "65534 65534 0000000000000000 1"
    assert "init" in init
