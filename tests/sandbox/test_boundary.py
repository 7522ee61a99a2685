"""The isolation boundary on both backends: what goes in, what comes out, who runs.

The local backend is built as the trainer builds it (`python=sys.executable`,
a virtual environment whose interpreter may sit in a private home directory).
"""

import os
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings

import pytest

from tests.sandbox.conftest import TEST_LIMITS, local_executor
from wmrl_jax.sandbox import InputError, LocalExecutor, WeakIsolationWarning, make_executor

SECRET = "ROOT-ONLY-SECRET-7d1f"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the attacks need a root caller")


def run(executor, source, **kwargs):
    return executor.run(textwrap.dedent(source), **kwargs)


@pytest.fixture
def secret_dir(tmp_path):
    """A root-only directory holding a root-only file, next to nothing mounted."""
    private = tmp_path / "rootonly"
    private.mkdir(mode=0o700)
    secret = private / "secret.txt"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    return private


@pytest.fixture
def open_dir():
    """A directory every user can reach and read (as a task directory often is)."""
    path = tempfile.mkdtemp(prefix="wmrl-boundary-")
    os.chmod(path, 0o755)
    yield path
    subprocess.run(["rm", "-rf", path], check=False)


def assert_no_secret(result):
    for content in result.files.values():
        assert SECRET.encode() not in content, result
    assert SECRET not in result.stdout + result.stderr, result


# ---- 1: outputs are collected without following any link ----------------------------


@needs_root
def test_output_dir_replaced_by_a_link(executor, secret_dir):
    result = run(
        executor,
        f"""
        import os
        os.rename("output", "o2")
        os.symlink({str(secret_dir)!r}, "output")
        """,
    )
    assert result.status == "ok", result
    assert result.files == {}
    assert_no_secret(result)


@needs_root
def test_output_subdir_replaced_by_a_link(executor, secret_dir):
    result = run(
        executor,
        f"""
        import os
        os.makedirs("output/sub")
        open("output/kept.txt", "w").write("fine")
        os.rename("output/sub", "elsewhere")
        os.symlink({str(secret_dir)!r}, "output/sub")
        """,
    )
    assert result.status == "ok", result
    assert result.files == {"kept.txt": b"fine"}
    assert "sub" in result.message
    assert_no_secret(result)


@needs_root
def test_hard_link_to_a_root_only_file(executor, secret_dir):
    result = run(
        executor,
        f"""
        import os
        try:
            os.link({str(secret_dir / "secret.txt")!r}, "output/secret.txt")
            print("linked")
        except OSError as e:
            print("refused", type(e).__name__)
        """,
    )
    assert result.status == "ok", result
    assert "secret.txt" not in result.files
    assert_no_secret(result)


@needs_root
def test_hard_link_is_dropped_even_when_running_as_root(secret_dir):
    # The opt-in root mode: the host's file does not exist for the program; a
    # hard link it makes of its own file, the collector must still refuse.
    with local_executor(switch_user=False, allow_root=True, timeout_s=30) as ex:
        result = run(
            ex,
            f"""
            import os
            try:
                os.link({str(secret_dir / "secret.txt")!r}, "output/secret.txt")
            except OSError as e:
                print("refused", type(e).__name__)
            os.rename("output", "o2")
            os.mkdir("output")
            open("o2/mine.txt", "w").write("x")
            os.link("o2/mine.txt", "output/again.txt")
            open("output/own.txt", "w").write("mine")
            """,
        )
    assert result.status == "ok", result
    assert result.stdout == "refused FileNotFoundError\n"
    assert result.files == {"own.txt": b"mine"}
    assert "again.txt (hard link" in result.message
    assert_no_secret(result)


# ---- 2: links in an input dir never lead out of it ----------------------------------


def make_public(root):
    public = root / "public"
    private = root / "private"
    public.mkdir()
    private.mkdir()
    (public / "train.csv").write_text("x\n1\n")
    (private / "answers.csv").write_text(SECRET)
    return public, private


@pytest.mark.parametrize("target", ["../private/answers.csv", "private", "/etc"])
def test_input_link_leaving_the_dir_is_refused(executor, tmp_path, target):
    public, private = make_public(tmp_path)
    link = public / "answers.csv"
    if target == "private":
        link.symlink_to(private, target_is_directory=True)
    else:
        link.symlink_to(target)
    with pytest.raises(InputError, match="answers.csv"):
        run(executor, "import shutil; shutil.copytree('input', 'output/x')", input_dir=public)


def test_input_link_inside_the_dir_is_a_plain_copy(executor, tmp_path):
    public, _ = make_public(tmp_path)
    (public / "alias.csv").symlink_to("train.csv")
    result = run(
        executor,
        """
        import os
        print(os.path.islink("input/alias.csv"), open("input/alias.csv").read().split())
        """,
        input_dir=public,
    )
    assert result.status == "ok", result
    assert result.stdout == "False ['x', '1']\n"


# ---- 3: no program runs as root, nor reaches root's processes or files ---------------


def test_program_runs_unprivileged_with_the_libraries(executor):
    result = run(
        executor,
        """
        import os, numpy, sklearn
        print(os.getuid(), os.geteuid(), os.getgroups(), numpy.ones(3).sum())
        """,
        timeout_s=60,
    )
    assert result.status == "ok", result
    uid, euid, groups, total = result.stdout.split(maxsplit=3)
    if os.geteuid() == 0:
        assert uid == euid != "0"
        assert groups.strip() in ("[]", f"[{uid}]")
    assert total.strip() == "3.0"


@needs_root
def test_root_processes_environ_is_unreadable(executor):
    canary = f"WMRL_CANARY_{os.getpid()}_{time.monotonic_ns()}"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={"PATH": "/usr/bin:/bin", "CANARY": canary},
    )
    try:
        result = run(
            executor,
            """
            import os
            readable = 0
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    data = open(f"/proc/{pid}/environ", "rb").read()
                except OSError:
                    continue
                readable += 1
                if b"WMRL_CANARY" in data:
                    print("FOUND", pid, data[:200])
            print("parent", os.getppid(), "readable", readable)
            """,
        )
    finally:
        holder.kill()
        holder.wait()
    assert result.status == "ok", result
    assert canary not in result.stdout and "FOUND" not in result.stdout, result


@needs_root
def test_original_input_dir_is_not_writable(executor, open_dir):
    public = os.path.join(open_dir, "public")
    os.mkdir(public, 0o755)
    with open(os.path.join(public, "train.csv"), "w") as f:
        f.write("x\n1\n")
    os.chmod(os.path.join(public, "train.csv"), 0o644)
    result = run(
        executor,
        f"""
        import os
        public = {public!r}
        for attempt in (
            lambda: open(os.path.join(public, "train.csv"), "a").write("tampered"),
            lambda: open(os.path.join(public, "new.csv"), "w").write("new"),
            lambda: os.remove(os.path.join(public, "train.csv")),
            lambda: os.chmod(public, 0o777),
        ):
            try:
                attempt()
                print("DID")
            except OSError as e:
                print("denied", type(e).__name__)
        """,
        input_dir=public,
    )
    assert result.status == "ok", result
    assert os.listdir(public) == ["train.csv"]
    with open(os.path.join(public, "train.csv")) as f:
        assert f.read() == "x\n1\n"
    assert stat.S_IMODE(os.stat(public).st_mode) == 0o755


def test_process_cap_holds(executor):
    if executor.environment.startswith("local") and os.geteuid() != 0:
        pytest.skip("RLIMIT_NPROC counts all of this user's processes; not risking it")
    wanted = TEST_LIMITS.pids + 16
    result = run(
        executor,
        f"""
        import os, time
        started = 0
        for _ in range({wanted}):
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                time.sleep(3)
                os._exit(0)
            started += 1
        print("started", started)
        """,
        timeout_s=30,
    )
    assert result.status in ("ok", "oom", "killed"), result
    if result.status == "ok":
        assert int(result.stdout.split()[1]) < TEST_LIMITS.pids, result


# ---- the local backend's opt-in ------------------------------------------------------


@needs_root
def test_running_as_root_needs_an_explicit_opt_in():
    with pytest.raises(ValueError, match="allow_root=True"):
        LocalExecutor(python=sys.executable, switch_user=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", WeakIsolationWarning)
        with LocalExecutor(python=sys.executable, switch_user=False, allow_root=True) as ex:
            assert ex.run("import os; print(os.getuid())").stdout == "0\n"
        # make_executor hands the local-only keyword to the local backend only.
        ex = make_executor("wmrl-no-such-image:0", python=sys.executable, allow_root=True)
        assert isinstance(ex, LocalExecutor)
        ex.close()
