"""LocalExecutor: one subprocess per program, rlimits, a private temp dir.

The embedded default when no Docker engine is reachable. Weaker than Docker:
the network is NOT isolated, the work dir has no size cap (only single files
are capped), and the program sees the host's filesystem with the permissions
of the user it runs as.

As root (the only way it runs untrusted programs, unless the caller passes
`allow_root=True`), each program runs under a user id of its own (61000 + a
free slot, no login, no supplementary groups): RLIMIT_NPROC then bounds
exactly that program's processes, the program cannot read root-only files
(/etc/shadow, other processes' /proc/<pid>/environ, a task's private answers
in a root-only directory) nor write to root-owned directories, and everything
that uid still runs after the main program exits (daemonised children
included) is killed, and its files in /tmp, /var/tmp and /dev/shm removed.
An interpreter that such a uid cannot reach (one under a private home
directory, or a virtual environment linking there) is staged first
(`interpreter.stage_interpreter`). Without root the program runs as the
caller: its process group is killed, but a descendant that calls setsid()
can escape, and RLIMIT_NPROC counts all of the caller's processes.

Inputs are copied in as plain files (`files.copy_input`: a link leaving the
input dir is refused) and outputs are read through a directory descriptor of
the work dir without following any link (`files.read_output`).
"""

import contextlib
import fcntl
import logging
import math
import os
import selectors
import signal
import stat
import subprocess
import sys
import tempfile
import time
import warnings

from wmrl_jax.sandbox.files import copy_input, read_output, remove_tree
from wmrl_jax.sandbox.interpreter import Interpreter, reachable, stage_interpreter
from wmrl_jax.sandbox.result import (
    INPUT_NAME,
    OUTPUT_NAME,
    PROGRAM_NAME,
    BaseExecutor,
    ExecutionResult,
    Limits,
    TailBuffer,
    check_files,
    check_input_dir,
    check_timeout,
    infra_error,
)

log = logging.getLogger(__name__)

UID_BASE = 61000
UID_SLOTS = 256
# Fixed at import: every process of this machine must agree on it.
_UID_LOCK_DIR = os.path.join(tempfile.gettempdir(), "wmrl-sandbox-uids")
READ_CHUNK = 1 << 16
# After the main program exits and its descendants are killed, pipes normally
# reach EOF at once; an escaped process holding them is given this long.
DRAIN_GRACE_S = 1.0
# Sets the limits named in argv[1] to the values in argv[2], then execs argv[3:].
_LAUNCHER = (
    "import os, resource, sys\n"
    "for n, v in zip(sys.argv[1].split(','), sys.argv[2].split(',')):\n"
    "    resource.setrlimit(getattr(resource, n), (int(v), int(v)))\n"
    "os.execv(sys.argv[3], sys.argv[3:])\n"
)


class WeakIsolationWarning(UserWarning):
    """The local backend does not isolate the network nor cap the work dir."""


def _world_executable(path: str) -> bool:
    """Whether a user with no privileges can execute `path` (every directory searchable)."""
    return reachable(path) and bool(os.stat(path).st_mode & stat.S_IXOTH)


def _uid_processes(uid: int) -> list[int]:
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


def _kill_uid(uid: int, interpreter: Interpreter) -> bool:
    """SIGKILLs every process of `uid`; True when none is left."""
    for _ in range(50):
        if not _uid_processes(uid):
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
    return not _uid_processes(uid)


def _remove_uid_files(uid: int) -> None:
    for shared in ("/tmp", "/var/tmp", "/dev/shm"):
        with contextlib.suppress(OSError):
            for entry in os.scandir(shared):
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_uid == uid:
                        remove_tree(entry.path)


@contextlib.contextmanager
def _uid_slot(interpreter: Interpreter):
    """A user id no other run (in any process) uses at the same time."""
    lock_dir = _UID_LOCK_DIR
    os.makedirs(lock_dir, mode=0o700, exist_ok=True)
    info = os.lstat(lock_dir)  # a program may have made this path first, as itself or a link
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise PermissionError(f"{lock_dir} is not a private directory of uid {os.geteuid()}")
    start = os.getpid() % UID_SLOTS
    for i in range(UID_SLOTS):
        uid = UID_BASE + (start + i) % UID_SLOTS
        path = os.path.join(lock_dir, str(uid))
        fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            _kill_uid(uid, interpreter)  # a previous owner that crashed may have left processes
            yield uid
        finally:
            os.close(fd)
        return
    raise RuntimeError(f"all {UID_SLOTS} sandbox user ids are busy")


class LocalExecutor(BaseExecutor):
    """Runs each program as a subprocess with rlimits in a private temp dir.

    Network access is NOT prevented and the work dir is not size-capped; use
    `DockerExecutor` for untrusted programs. A warning says so at start-up.
    Inputs are copied into the work dir read-only (`input/`); files written
    under `output/` are returned. The environment is empty but for PATH, HOME,
    TMPDIR, LANG, WMRL_INPUT_DIR and WMRL_OUTPUT_DIR.

    Example:
        >>> ex = LocalExecutor(timeout_s=10)  # doctest: +SKIP
        >>> ex.run("print(1 + 1)").stdout
        '2\\n'

    Args:
        python: interpreter for the programs; default the running one. As root,
            one that an unprivileged uid cannot reach is staged first (see
            `interpreter.stage_interpreter`); `environment` still names `python`.
        limits: resource limits (`Limits`); `cpus` is not enforced locally.
        timeout_s: default wall-clock timeout.
        max_workers: threads behind `submit`.
        switch_user: run each program under its own unprivileged uid (only
            possible as root). Default: whenever root.
        allow_root: accept running programs as root (`switch_user=False` as
            root). Without it that is refused: a program running as root can
            read the caller's secrets, leave daemons behind and ignore the
            process cap.

    Raises:
        ValueError: `switch_user=True` without root, or root with
            `switch_user=False` and not `allow_root`.
        InfraError: the interpreter cannot be made to run as an unprivileged uid.
    """

    def __init__(
        self,
        *,
        python: str | None = None,
        limits: Limits | None = None,
        timeout_s: float = 60.0,
        max_workers: int | None = None,
        switch_user: bool | None = None,
        allow_root: bool = False,
    ):
        super().__init__(max_workers=max_workers)
        self.limits = limits or Limits()
        self.timeout_s = check_timeout(timeout_s)
        root = os.geteuid() == 0
        self.switch_user = root if switch_user is None else switch_user
        if self.switch_user and not root:
            raise ValueError("switch_user=True needs root")
        if root and not self.switch_user and not allow_root:
            raise ValueError(
                "LocalExecutor refuses to run untrusted programs as root; leave switch_user "
                "unset (each program then runs as a uid of its own) or pass allow_root=True"
            )
        self.python = python or sys.executable
        self.interpreter = (
            stage_interpreter(self.python) if self.switch_user else Interpreter(self.python, {})
        )
        self.environment = f"local:{self.python}"
        message = (
            "LocalExecutor does not isolate the network and does not cap the work dir's "
            "size; run untrusted programs with DockerExecutor."
        )
        log.warning(message)
        warnings.warn(message, WeakIsolationWarning, stacklevel=2)

    def run(self, source, *, input_dir=None, timeout_s=None, files=None) -> ExecutionResult:
        """Runs `source` to completion or timeout; see `Executor.run`.

        Raises:
            ValueError: bad `files`, or `input_dir` is not a directory.
            InputError: `input_dir` holds a link that leaves it, or a special
                file (see `files.input_files`).
        """
        timeout = check_timeout(self.timeout_s if timeout_s is None else timeout_s)
        extra = check_files(files)
        check_input_dir(input_dir)
        start = time.monotonic()
        try:
            with contextlib.ExitStack() as stack:
                uid = stack.enter_context(_uid_slot(self.interpreter)) if self.switch_user else None
                # The work dir belongs to the program's uid; its parent does not, so
                # that removing that uid's files in /tmp afterwards spares it.
                outer = tempfile.mkdtemp(prefix="wmrl-local-")
                stack.callback(remove_tree, outer)
                os.chmod(outer, 0o711)
                work = os.path.join(outer, "work")
                os.mkdir(work)
                # Outputs are read through this descriptor, whatever the program renames.
                work_fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
                stack.callback(os.close, work_fd)
                self._prepare(work, source, extra, input_dir, uid)
                return self._execute(work, work_fd, timeout, uid, start)
        except OSError as e:
            return infra_error(
                f"local sandbox failed: {e!r}", wall_seconds=time.monotonic() - start
            )

    def _prepare(self, work, source, extra, input_dir, uid):
        owner = (lambda p: os.chown(p, uid, uid)) if uid is not None else (lambda p: None)
        os.chmod(work, 0o755)
        for name in (OUTPUT_NAME, "tmp"):
            os.mkdir(os.path.join(work, name))
            owner(os.path.join(work, name))
        if input_dir is not None:
            copy_input(input_dir, os.path.join(work, INPUT_NAME), file_mode=0o444, dir_mode=0o555)
        for name, content in {PROGRAM_NAME: source.encode(), **extra}.items():
            path = os.path.join(work, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(content)
            os.chmod(path, 0o444)
        # Last, so that the program may create files next to its own but not replace them.
        owner(work)

    def _rlimits(self, timeout: float, uid: int | None) -> dict[str, int]:
        lim = self.limits
        nproc = lim.pids
        if uid is None:  # RLIMIT_NPROC counts all of the caller's processes
            nproc += len(_uid_processes(os.getuid()))
        return {
            "RLIMIT_AS": lim.memory_bytes,
            "RLIMIT_CPU": math.ceil(timeout) + 1,
            "RLIMIT_FSIZE": lim.file_size_bytes,
            "RLIMIT_NPROC": nproc,
            "RLIMIT_CORE": 0,
            "RLIMIT_NOFILE": 1024,
        }

    def _execute(self, work, work_fd, timeout, uid, start) -> ExecutionResult:
        rl = self._rlimits(timeout, uid)
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": work,
            "TMPDIR": os.path.join(work, "tmp"),
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "WMRL_INPUT_DIR": os.path.join(work, INPUT_NAME),
            "WMRL_OUTPUT_DIR": os.path.join(work, OUTPUT_NAME),
            **self.interpreter.env,
        }
        user = {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}
        python = self.interpreter.executable
        argv = [python, "-I", "-S", "-c", _LAUNCHER, ",".join(rl)]
        argv += [",".join(str(v) for v in rl.values()), python, PROGRAM_NAME]
        proc = subprocess.Popen(
            argv,
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            **user,
        )
        out, err = TailBuffer(self.limits.tail_bytes), TailBuffer(self.limits.tail_bytes)
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ, out)
            sel.register(proc.stderr, selectors.EVENT_READ, err)
            pidfd = os.pidfd_open(proc.pid)
            try:
                sel.register(pidfd, selectors.EVENT_READ, None)
                timed_out = self._pump(sel, deadline=start + timeout, until_exit=True)
            finally:
                sel.unregister(pidfd)
                os.close(pidfd)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # main is unreaped: the group still exists
            leftovers = uid is not None and not _kill_uid(uid, self.interpreter)
            _, wait_status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(wait_status)
            self._pump(sel, deadline=time.monotonic() + DRAIN_GRACE_S, until_exit=False)
        proc.stdout.close()
        proc.stderr.close()
        if uid is not None:
            _remove_uid_files(uid)
        files, dropped = read_output(work_fd, OUTPUT_NAME, self.limits.output_bytes, owner=uid)
        notes = [f"output files left out: {', '.join(dropped)}"] if dropped else []
        if leftovers:
            notes.append(f"processes of uid {uid} survived SIGKILL")
        code = proc.returncode
        return ExecutionResult(
            status=_status(code, timed_out, err.text()),
            exit_code=code,
            wall_seconds=time.monotonic() - start,
            cpu_seconds=usage.ru_utime + usage.ru_stime,
            peak_memory_bytes=usage.ru_maxrss * 1024,
            stdout=out.text(),
            stderr=err.text(),
            stdout_truncated=out.truncated,
            stderr_truncated=err.truncated,
            files=files,
            message="; ".join(notes),
        )

    @staticmethod
    def _pump(sel, *, deadline: float, until_exit: bool) -> bool:
        """Reads pipes into their buffers; True when `deadline` passed first."""
        exited = False
        while sel.get_map() and not exited:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            events = sel.select(remaining)
            for key, _ in events:
                if key.data is None:
                    exited = True
                    continue
                data = os.read(key.fd, READ_CHUNK)
                if data:
                    key.data.write(data)
                else:
                    sel.unregister(key.fileobj)
        return False


def _status(code: int, timed_out: bool, stderr: str) -> str:
    if timed_out or code == -signal.SIGXCPU:
        return "timeout"
    if code == 0:
        return "ok"
    # RLIMIT_AS makes allocations fail: Python raises MemoryError (numpy's
    # _ArrayMemoryError included); C code that ignores the failure segfaults.
    if "MemoryError" in stderr or code == -signal.SIGKILL:
        return "oom"
    return "killed" if code < 0 else "error"
