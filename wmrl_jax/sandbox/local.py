"""LocalExecutor: one subprocess per program in new namespaces, rlimits, a private work dir.

The embedded default when no Docker engine is reachable. Each program runs
through `nslaunch` in new user, mount, pid, ipc, net and uts namespaces and
sees an allowlist of the filesystem (`namespace.make_view`): the system
directories and its interpreter read-only, its own work dir, and private
/proc, /tmp and /dev/shm (size-capped tmpfs). Task trees (answers), caches,
other programs' work dirs, /run and the host's processes do not exist for
it; the network is an empty namespace (loopback only); System V IPC dies
with the program. Where the kernel refuses unprivileged user namespaces
(`kernel.unprivileged_userns_clone=0`, `user.max_user_namespaces=0`, an
AppArmor restriction, a seccomp profile), `LocalExecutor` refuses to start
(`InfraError` naming the reason and the Docker backend): without a private
view, grader-side data readable by the program's uid would be readable by
the program. Not isolated: CPU share (CPU time is bounded) and the work
dir's size (single files are capped).

As root (unless the caller passes `allow_root=True`), each program also runs
under a user id of its own (61000 + a free slot, no login, no supplementary
groups): RLIMIT_NPROC bounds exactly that program's processes, the program
cannot read root-only files in the allowlisted dirs (/etc/shadow), and
everything that uid still runs after the program is killed. An interpreter
that such a uid cannot reach (one under a private home directory, or a
virtual environment linking there) is staged first
(`interpreter.stage_interpreter`).

Inputs are copied in as plain files (`files.copy_input`: a link leaving the
input dir is refused) and outputs are read through a directory descriptor of
the work dir without following any link (`files.read_output`). `close()`
(also at interpreter exit) kills running programs and removes their work
dirs; a new executor removes what a killed trainer left (`leftovers`).
"""

import atexit
import contextlib
import logging
import math
import os
import selectors
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import weakref

from wmrl_jax.sandbox import leftovers, namespace, uids
from wmrl_jax.sandbox.files import InputError, copy_input, read_output, remove_tree
from wmrl_jax.sandbox.interpreter import Interpreter, reachable, stage_interpreter, view_paths
from wmrl_jax.sandbox.result import (
    INPUT_NAME,
    OUTPUT_NAME,
    PROGRAM_NAME,
    BaseExecutor,
    ExecutionResult,
    InfraError,
    Limits,
    TailBuffer,
    check_files,
    check_input_dir,
    check_timeout,
    infra_error,
)

log = logging.getLogger(__name__)

READ_CHUNK = 1 << 16
# After the main program exits and its descendants are killed, pipes normally
# reach EOF at once; an escaped process holding them is given this long.
DRAIN_GRACE_S = 1.0
# Longest single wait on the pipes; epoll's timeout is a C int of milliseconds.
MAX_WAIT_S = 3600.0


class WeakIsolationWarning(UserWarning):
    """The local backend does not share out the CPU nor cap the work dir."""


def _world_executable(path: str) -> bool:
    """Whether a user with no privileges can execute `path` (every directory searchable)."""
    return reachable(path) and bool(os.stat(path).st_mode & stat.S_IXOTH)


class LocalExecutor(BaseExecutor):
    """Runs each program in new namespaces with rlimits in a private work dir.

    See the module docstring for what is isolated; use `DockerExecutor` for a
    CPU share and a capped work dir. One log line (and a
    `WeakIsolationWarning`) states the isolation at start-up. Inputs are
    copied into the work dir read-only (`input/`); files written under
    `output/` are returned. The environment is empty but for PATH, HOME,
    TMPDIR, LANG, WMRL_INPUT_DIR and WMRL_OUTPUT_DIR.

    Example:
        >>> ex = LocalExecutor(timeout_s=10)  # doctest: +SKIP
        >>> ex.run("print(1 + 1)").stdout
        '2\\n'

    Args:
        python: interpreter for the programs; default the running one. As root,
            one that an unprivileged uid cannot reach is staged first (see
            `interpreter.stage_interpreter`); `environment` still names `python`.
        limits: resource limits (`Limits`); `cpus` and `work_bytes` are not
            enforced locally; /tmp and /dev/shm are tmpfs of `tmp_bytes` each.
        timeout_s: default wall-clock timeout.
        max_workers: threads behind `submit`.
        switch_user: run each program under its own unprivileged uid (only
            possible as root). Default: whenever root.
        allow_root: accept running programs as root (`switch_user=False` as
            root). Without it that is refused: a program running as root can
            read the caller's secrets in the allowlisted dirs and ignore the
            process cap.

    Raises:
        ValueError: `switch_user=True` without root, or root with
            `switch_user=False` and not `allow_root`.
        InfraError: the interpreter cannot be made to run as an unprivileged
            uid, or the kernel refuses the namespaces (the message says why).
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
        self.view = namespace.make_view(view_paths(self.python, self.interpreter))
        self._live: dict[int, tuple[int, str]] = {}  # run id -> (program pidfd, outer dir)
        self._live_lock = threading.Lock()
        self._closed = False
        removed = leftovers.remove_stale()
        if self.switch_user:
            uids.reap_free_slots(self.interpreter)
        if removed:
            log.warning("removed %d work dirs of killed runs: %s", len(removed), removed)
        self._probe()
        message = namespace.describe(self.view, self.switch_user)
        log.warning(message)
        warnings.warn(message, WeakIsolationWarning, stacklevel=2)
        _register_exit(self)

    def _probe(self) -> None:
        """Runs a trivial program; InfraError naming the reason when namespaces are refused."""
        result = self.run("pass", timeout_s=max(self.timeout_s, namespace.HANDSHAKE_S))
        if result.status != "ok":
            reason = result.stderr.strip().splitlines()[-1:] or [result.message]
            raise InfraError(
                f"the local sandbox cannot isolate programs here ({reason[0]}); it needs "
                "unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, "
                "user.max_user_namespaces>0, no AppArmor/seccomp restriction) and refuses to "
                "run without them, since programs could read grader-side files; use the "
                "Docker backend (DockerExecutor, config executor.kind=docker) instead"
            )

    def close(self) -> None:
        """Kills running programs, waits for their runs and removes their work dirs."""
        self._closed = True
        with self._live_lock:
            live = list(self._live.values())
        for pidfd, _ in live:
            namespace.kill_pidfd(pidfd)
        super().close()
        with self._live_lock:
            for _, outer in self._live.values():  # runs of threads not ours, still unwinding
                remove_tree(outer)

    def run(self, source, *, input_dir=None, timeout_s=None, files=None) -> ExecutionResult:
        """Runs `source` to completion or timeout; see `Executor.run`.

        Raises:
            ValueError: bad `files`, or `input_dir` is not a directory.
            InputError: `input_dir` holds a link that leaves it, or a special
                file (see `files.input_files`), or it lies where the program
                would see its task's other files (inside an allowlisted dir).
        """
        timeout = check_timeout(self.timeout_s if timeout_s is None else timeout_s)
        extra = check_files(files)
        check_input_dir(input_dir)
        if input_dir is not None:
            task_dir = os.path.dirname(os.path.realpath(input_dir))
            if (bind := namespace.exposed(self.view, task_dir)) is not None:
                raise InputError(
                    f"input_dir {input_dir} lies inside {bind}, which every program sees; "
                    "its task's private files would be readable: move the task tree elsewhere"
                )
        if self._closed:
            return infra_error("the executor is closed")
        start = time.monotonic()
        try:
            with contextlib.ExitStack() as stack:
                uid = (
                    stack.enter_context(uids.uid_slot(self.interpreter))
                    if self.switch_user
                    else None
                )
                # The work dir belongs to the program's uid; its parent (the owner
                # mark, the new root's mount point) belongs to the caller.
                outer = tempfile.mkdtemp(prefix=leftovers.PREFIX)
                stack.callback(remove_tree, outer)
                leftovers.mark(outer)
                os.chmod(outer, 0o711)
                work = os.path.join(outer, "work")
                os.mkdir(work)
                os.mkdir(os.path.join(outer, "root"), 0o755)
                # Outputs are read through this descriptor, whatever the program renames.
                work_fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
                stack.callback(os.close, work_fd)
                self._prepare(work, source, extra, input_dir, uid)
                return self._execute(outer, work, work_fd, timeout, uid, start)
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

    def _rlimits(self, timeout: float) -> dict[str, int]:
        lim = self.limits
        return {
            "RLIMIT_AS": lim.memory_bytes,
            "RLIMIT_CPU": math.ceil(timeout) + 1,
            "RLIMIT_FSIZE": lim.file_size_bytes,
            # Counted per uid in the program's own user namespace: its processes, and
            # the launcher that made the namespace (+1).
            "RLIMIT_NPROC": lim.pids + 1,
            "RLIMIT_CORE": 0,
            "RLIMIT_NOFILE": 1024,
        }

    def _spawn(self, outer, work, timeout, uid, start):
        """Starts the launcher; (process, program pidfd or None)."""
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
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        spec = {
            "fd": theirs.fileno(),
            "parent": os.getpid(),
            "root": os.path.join(outer, "root"),
            "work": work,
            "binds": list(self.view.binds),
            "links": self.view.links,
            "tmp_bytes": self.limits.tmp_bytes,
            "shm_bytes": self.limits.tmp_bytes,
            "rlimits": self._rlimits(timeout),
            "argv": [python, PROGRAM_NAME],
        }
        with ours, theirs:
            proc = subprocess.Popen(
                namespace.launcher_argv(python, spec),
                cwd="/",
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                pass_fds=(theirs.fileno(),),
                **user,
            )
            theirs.close()
            pidfd = namespace.receive_pidfd(ours, start + timeout)
        return proc, pidfd

    def _execute(self, outer, work, work_fd, timeout, uid, start) -> ExecutionResult:
        proc, pidfd = self._spawn(outer, work, timeout, uid, start)
        run_id = id(proc)
        if pidfd is not None:
            with self._live_lock:
                self._live[run_id] = (pidfd, outer)
            leftovers.mark(outer, launcher=proc.pid, program=namespace.pidfd_pid(pidfd))
            if self._closed:  # close() came between the check in run() and here
                namespace.kill_pidfd(pidfd)
        out, err = TailBuffer(self.limits.tail_bytes), TailBuffer(self.limits.tail_bytes)
        try:
            with selectors.DefaultSelector() as sel:
                sel.register(proc.stdout, selectors.EVENT_READ, out)
                sel.register(proc.stderr, selectors.EVENT_READ, err)
                exit_fd = os.pidfd_open(proc.pid)
                try:
                    sel.register(exit_fd, selectors.EVENT_READ, None)
                    timed_out = self._pump(sel, deadline=start + timeout, until_exit=True)
                finally:
                    sel.unregister(exit_fd)
                    os.close(exit_fd)
                if pidfd is not None:  # pid 1 of the program's namespace: all of it dies
                    namespace.kill_pidfd(pidfd)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # main is unreaped: the group still exists
                survivors = uid is not None and not uids.kill_uid(uid, self.interpreter)
                _, wait_status, usage = os.wait4(proc.pid, 0)
                proc.returncode = os.waitstatus_to_exitcode(wait_status)
                self._pump(sel, deadline=time.monotonic() + DRAIN_GRACE_S, until_exit=False)
        finally:
            if pidfd is not None:
                with self._live_lock:
                    del self._live[run_id]
                os.close(pidfd)
            proc.stdout.close()
            proc.stderr.close()
        files, dropped = read_output(work_fd, OUTPUT_NAME, self.limits.output_bytes, owner=uid)
        notes = [f"output files left out: {', '.join(dropped)}"] if dropped else []
        if survivors:
            notes.append(f"processes of uid {uid} survived SIGKILL")
        code = proc.returncode
        if self._closed:
            return infra_error(
                "the executor was closed while the program ran; it was killed",
                wall_seconds=time.monotonic() - start,
            )
        if code == namespace.FAILED and "wmrl-sandbox:" in err.text():
            return infra_error(
                f"local sandbox failed: {err.text().strip()[-500:]}",
                wall_seconds=time.monotonic() - start,
            )
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
            # epoll takes milliseconds as a C int: a wait past ~24.8 days overflows.
            events = sel.select(min(remaining, MAX_WAIT_S))
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


def _register_exit(executor: LocalExecutor) -> None:
    """Closes `executor` at interpreter exit, before the thread pools wait for their runs."""
    ref = weakref.ref(executor)

    def close():
        if (ex := ref()) is not None:
            ex.close()

    # threading's exit hooks run last registered first, before threads are joined;
    # the pools' own hook (joining their workers) is registered when this module loads.
    from concurrent.futures import thread  # noqa: F401

    register = getattr(threading, "_register_atexit", atexit.register)
    with contextlib.suppress(RuntimeError):  # registering during interpreter shutdown
        register(close)


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
