"""The local backend's namespaces: grader-side data, other programs and the host are unreachable.

Cheats go through the real outcome path (`SandboxOutcomes`): a program that
finds a task's answers scores 1.0, an honest one 0.5; both must score alike.
The non-root case runs the executor for real as an unprivileged uid (setpriv).
"""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

from tests.sandbox.conftest import TEST_LIMITS, local_executor
from wmrl_jax.sandbox import InfraError, namespace
from wmrl_jax.sandbox.files import InputError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOBODY = 65534
MiB = 1 << 20
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching to another uid needs root")

HONEST = """
import os
with open(os.path.join(os.environ["WMRL_OUTPUT_DIR"], "submission.csv"), "w") as f:
    f.write("id,target\\n0,2.0\\n1,2.0\\n2,2.0\\n")
"""
# Looks for answers.csv everywhere a program could: the task dir it was given
# (by name), the input dir's real path and its parents, the task cache, /tmp,
# the whole filesystem; submits them when found, else the honest guess.
CHEAT = """
import os
candidates = [{task!r} + "/private/answers.csv", {cache!r}]
path = os.path.realpath(os.environ["WMRL_INPUT_DIR"])
while path != "/":
    path = os.path.dirname(path)
    candidates += [path + "/private/answers.csv", path]
candidates += ["/tmp", "/"]
found = None
for root in candidates:
    if os.path.isfile(root):
        found = root
        break
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in ("proc", "sys", "usr")]
        if "answers.csv" in filenames:
            found = os.path.join(dirpath, "answers.csv")
            break
    if found:
        break
print("found", found)
with open(os.path.join(os.environ["WMRL_OUTPUT_DIR"], "submission.csv"), "w") as f:
    if found:
        f.write(open(found).read())
    else:
        f.write("id,target\\n0,2.0\\n1,2.0\\n2,2.0\\n")
"""
# Writes a toy task (RMSE; the honest guess scores percentile 0.5) and grades
# an honest program and the cheat through `SandboxOutcomes`; prints the rewards.
SCORE = """
import json, os, sys
from wmrl_jax.envs.outcomes import SandboxOutcomes
from wmrl_jax.envs.task import load_task
from wmrl_jax.sandbox import LocalExecutor

task_dir, cache, honest, cheat = sys.argv[1:5]
os.makedirs(task_dir + "/public")
os.makedirs(task_dir + "/private/leaderboards")
manifest = {{
    "format_version": 1, "id": "toy", "source": "test", "split": "train",
    "metric": {{"name": "rmse", "direction": "lower"}},
    "submission": {{"file": "submission.csv", "id_column": "id",
                    "target_columns": ["target"], "answer_column": "target"}},
    "limits": {{"wall_seconds": 60, "memory_mb": 512}},
    "percentile_rule": "mid_rank", "leaderboards": ["private"],
}}
files = {{
    "manifest.json": json.dumps(manifest), "description.md": "# toy\\n",
    "public/sample_submission.csv": "id,target\\n0,0\\n1,0\\n2,0\\n",
    "private/answers.csv": "id,target\\n0,1.0\\n1,2.0\\n2,3.0\\n",
    "private/leaderboards/private.csv": "entry,score\\ne0,0.01\\ne1,5.0\\n",
}}
for name, text in files.items():
    with open(os.path.join(task_dir, name), "w") as f:
        f.write(text)
os.makedirs(cache, exist_ok=True)
with open(os.path.join(cache, "answers.csv"), "w") as f:
    f.write(files["private/answers.csv"])
for root, dirs, names in os.walk(os.path.dirname(task_dir)):  # world-readable
    for d in dirs:
        os.chmod(os.path.join(root, d), 0o755)
    for n in names:
        os.chmod(os.path.join(root, n), 0o644)
task = load_task(task_dir)
outcomes = SandboxOutcomes(LocalExecutor(python=sys.executable, timeout_s=60))
got = {{k: outcomes.submit(task, open(p).read()).result() for k, p in
       (("honest", honest), ("cheat", cheat))}}
outcomes.close()
print(json.dumps({{k: [o.status, o.reward, o.message] for k, o in got.items()}}))
"""


def world_readable_dir() -> str:
    """A fresh dir that any uid can reach (pytest's tmp_path is private to root)."""
    path = tempfile.mkdtemp(prefix="wmrl-isolation-test-")
    os.chmod(path, 0o755)
    return path


def score(scratch: str, *, user: list[str], python: str, env: dict) -> dict:
    """Rewards of the honest program and the cheat on a world-readable task in `scratch`."""
    task, cache = os.path.join(scratch, "tree", "toy"), os.path.join(scratch, "cache")
    paths = {}
    for name, text in (("honest", HONEST), ("cheat", CHEAT.format(task=task, cache=cache))):
        paths[name] = os.path.join(scratch, f"{name}.py")
        with open(paths[name], "w") as f:
            f.write(text)
        os.chmod(paths[name], 0o644)
    out = subprocess.run(
        [*user, python, "-c", SCORE.format(), task, cache, paths["honest"], paths["cheat"]],
        capture_output=True, text=True, timeout=600, env=env, cwd=scratch, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def assert_cheat_scores_like_honest(got: dict) -> None:
    (honest_status, honest, _), (cheat_status, cheat, _) = got["honest"], got["cheat"]
    assert honest_status == cheat_status == "ok", got
    assert 0.0 < honest < 1.0, got  # the board puts the honest guess mid-table
    assert cheat == honest, got


def test_cheat_finds_no_answers_in_a_world_readable_task_tree():
    scratch = world_readable_dir()
    try:
        env = {**os.environ, "PYTHONPATH": REPO}
        assert_cheat_scores_like_honest(score(scratch, user=[], python=sys.executable, env=env))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@needs_root
def test_cheat_finds_no_answers_when_the_trainer_is_not_root():
    from wmrl_jax.sandbox.interpreter import stage_interpreter

    staged = stage_interpreter(sys.executable)  # a python that uid 65534 can run
    scratch = world_readable_dir()
    try:
        # The package, where an unprivileged uid can import it from.
        shutil.copytree(
            os.path.join(REPO, "wmrl_jax"),
            os.path.join(scratch, "pkg", "wmrl_jax"),
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        subprocess.run(["chmod", "-R", "a+rX", scratch], check=True)
        os.chown(scratch, NOBODY, NOBODY)
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": scratch,
            "LANG": "C.UTF-8",
            "PYTHONPATH": os.path.join(scratch, "pkg"),
            **staged.env,
        }
        user = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
        got = score(scratch, user=user, python=staged.executable, env=env)
        assert_cheat_scores_like_honest(got)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_input_dir_inside_the_allowlist_is_refused(tmp_path):
    (tmp_path / "toy" / "public").mkdir(parents=True)
    (tmp_path / "toy" / "private").mkdir()
    with local_executor(timeout_s=30) as ex:
        ex.view = namespace.make_view([str(tmp_path)])  # as if it were the interpreter's prefix
        with pytest.raises(InputError, match="private files would be readable"):
            ex.run("print(1)", input_dir=tmp_path / "toy" / "public")


def test_refuses_to_start_where_namespaces_are_refused(monkeypatch):
    # An unshare(2) that the kernel rejects, as where user namespaces are disabled.
    source = namespace.LAUNCHER_SOURCE.replace("CLONE_NEWUSER = 0x10000000", "CLONE_NEWUSER = 1")
    assert source != namespace.LAUNCHER_SOURCE
    monkeypatch.setattr(namespace, "LAUNCHER_SOURCE", source)
    with pytest.raises(InfraError, match=r"unshare.*Docker backend"):
        local_executor(timeout_s=30)


def test_program_sees_only_its_allowlist():
    with local_executor(timeout_s=30) as ex:
        result = ex.run(
            textwrap.dedent(
                """
                import os
                print(sorted(os.listdir("/")))
                print(sorted(p for p in os.listdir("/proc") if p.isdigit()))
                print(sorted(os.listdir("/tmp")))
                print(os.getcwd().split("/")[2])
                """
            )
        )
    assert result.status == "ok", result
    top, pids, tmp, own = (
        eval(line) if "[" in line else line for line in result.stdout.split("\n")[:4]
    )
    assert not {"home", "root", "run", "var", "srv", "mnt"} & set(top), top
    assert pids == ["1"]  # alone in its pid namespace
    assert set(tmp) <= {own, "wmrl-sandbox-python"}, tmp  # its own work dir, the staged python


def _find_on_host(token: str, deadline_s: float = 120.0) -> str:
    """The work dir whose output/submission.csv holds `token` (waits for the program)."""
    import glob
    import time

    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for path in glob.glob(os.path.join(tempfile.gettempdir(), "wmrl-local-*", "work")):
            try:
                with open(os.path.join(path, "output", "submission.csv")) as f:
                    if token in f.read():
                        return path
            except OSError:
                pass
        time.sleep(0.05)
    raise AssertionError(f"no program wrote {token}")


def test_concurrent_program_cannot_read_a_siblings_submission():
    token = f"SIBLING-{os.getpid()}-{os.urandom(4).hex()}"
    first = f"""
    import os, time
    open("output/submission.csv", "w").write({token!r})
    while not os.path.exists("go"):  # the host says when the sibling is done
        time.sleep(0.02)
    """
    sibling = """
    import glob, os
    paths = [{work!r} + "/output/submission.csv"]
    paths += glob.glob("/tmp/*/work/output/*") + glob.glob("/proc/*/cwd/output/*")
    paths += glob.glob("/proc/*/root" + {work!r} + "/output/*")
    for root in ("/tmp", "/"):
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d not in ("proc", "sys", "usr")]
            paths += [os.path.join(dirpath, n) for n in filenames if n == "submission.csv"]
    for path in paths:
        try:
            print(path, open(path).read())
        except OSError as e:
            print(path, type(e).__name__)
    print("searched", len(paths))
    """
    with local_executor(timeout_s=120, max_workers=2) as ex:
        running = ex.submit(textwrap.dedent(first))
        work = _find_on_host(token)
        try:
            result = ex.run(textwrap.dedent(sibling).format(work=work))
        finally:
            with open(os.path.join(work, "go"), "w"):
                pass
        done = running.result(timeout=300)
    assert done.status == "ok" and done.files == {"submission.csv": token.encode()}, done
    assert result.status == "ok" and "searched" in result.stdout, result
    assert token not in result.stdout, result.stdout


def test_dev_shm_is_private_and_capped():
    limits = dataclasses.replace(TEST_LIMITS, tmp_bytes=4 * MiB)
    with local_executor(timeout_s=60, limits=limits) as ex:
        result = ex.run(
            textwrap.dedent(
                """
                import os
                print(sorted(os.listdir("/dev/shm")))
                written = 0
                try:
                    with open("/dev/shm/fill", "wb") as f:
                        while written < 64 << 20:
                            f.write(b"\\0" * (1 << 20))
                            f.flush()
                            written += 1 << 20
                except OSError as e:
                    print(type(e).__name__)
                print(written >> 20)
                """
            )
        )
    assert result.status == "ok", result
    listing, error, mib = result.stdout.split()
    assert listing == "[]" and error == "OSError" and int(mib) <= 4, result.stdout


SHM_KEY = 0x5EED0000 + os.getpid() % 0xFFFF
SYSV = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
shmid = libc.shmget({key}, 1 << 20, {flags})
print("shmid", shmid)
if shmid >= 0:
    addr = libc.shmat(shmid, None, 0)
    if {write}:
        ctypes.memmove(addr, b"SYSV-SECRET", 11)
    else:
        print(ctypes.string_at(addr, 11))
"""


def test_sysv_shared_memory_dies_with_the_program():
    with local_executor(timeout_s=60) as ex:
        made = ex.run(SYSV.format(key=SHM_KEY, flags=0o1000 | 0o666, write=True))
        later = ex.run(SYSV.format(key=SHM_KEY, flags=0, write=False))
    assert made.status == "ok" and int(made.stdout.split()[1]) >= 0, made
    assert later.stdout.strip() == "shmid -1", later  # gone, not readable by the next program
    with open("/proc/sysvipc/shm") as f:
        keys = [int(line.split()[0]) for line in f.readlines()[1:]]
    assert SHM_KEY not in keys  # nor left on the host


def test_run_lock_is_out_of_reach():
    with local_executor(timeout_s=60) as ex:
        first = ex.run(
            'try:\n    open("/run/lock/wmrl-left", "w").write("x")\n    print("wrote")\n'
            "except OSError as e:\n    print(type(e).__name__)\n"
        )
        second = ex.run("import os\nprint(os.path.exists('/run/lock/wmrl-left'))\n")
    assert first.stdout == "FileNotFoundError\n", first
    assert not os.path.exists("/run/lock/wmrl-left")
    assert (second.status, second.stdout) == ("ok", "False\n"), second


def test_other_processes_argv_is_out_of_reach():
    # A host process holding a secret in its argv, alive while the program looks (a
    # `sleep` given the flag would reject it and exit before the program ran).
    secret = f"--token=ARGV-SECRET-{os.urandom(4).hex()}"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", secret])
    try:
        with local_executor(timeout_s=60) as ex:
            result = ex.run(
                "import glob\n"
                "for p in glob.glob('/proc/[0-9]*/cmdline'):\n"
                "    print(open(p, 'rb').read())\n"
            )
        assert holder.poll() is None, "the holder ended before the program looked"
        with open(f"/proc/{holder.pid}/cmdline", "rb") as f:
            assert secret.encode() in f.read()  # the host sees it: the program must not
    finally:
        holder.kill()
        holder.wait()
    assert result.status == "ok" and result.stdout, result
    assert "ARGV-SECRET" not in result.stdout, result.stdout


def test_network_is_loopback_only_locally():
    import socket

    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        with local_executor(timeout_s=60) as ex:
            result = ex.run(
                textwrap.dedent(
                    f"""
                    import socket
                    s = socket.socket()
                    s.settimeout(5)
                    try:
                        s.connect(("127.0.0.1", {port}))
                        print("connected")
                    except OSError as e:
                        print("refused", type(e).__name__)
                    lines = open("/proc/net/dev").readlines()[2:]
                    print(sorted(line.split(":")[0].strip() for line in lines))
                    """
                )
            )
    finally:
        server.close()
    assert result.status == "ok", result
    assert result.stdout == "refused ConnectionRefusedError\n['lo']\n", result


def test_process_cap_counts_the_programs_processes_exactly():
    limits = dataclasses.replace(TEST_LIMITS, pids=8)
    with local_executor(timeout_s=60, limits=limits) as ex:
        result = ex.run(
            textwrap.dedent(
                """
                import os, time
                children = 0
                while children < 50:
                    try:
                        pid = os.fork()
                    except OSError:
                        break
                    if pid == 0:
                        time.sleep(30)
                        os._exit(0)
                    children += 1
                print(children)
                """
            )
        )
    assert result.status == "ok", result
    assert result.stdout == "7\n"  # the program and 7 children: `pids` processes
