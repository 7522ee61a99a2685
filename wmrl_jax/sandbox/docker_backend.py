"""DockerExecutor: one locked-down container per program.

Each run creates a container from the sandbox image with no network (only a
loopback interface), memory = memory+swap cap, a pids limit, a CPU quota, a
read-only root filesystem, size-capped tmpfs for /tmp and the work dir
/work, user nobody (65534), all capabilities dropped, no-new-privileges and
an init process. The container's main process only sleeps; the program runs
through an exec so that its output files can be read from the tmpfs work dir
after it exits. The host enforces the wall-clock timeout, and the container is
always removed (force), also when the caller is interrupted.

No container outlives its owner for long: `close()` and interpreter exit
(atexit) remove every container the executor started, also while programs run;
the main process sleeps only `KEEPER_GRACE_S` longer than the run's timeout, so
a container ends itself when its owner is SIGKILLed; and each container is
labelled with its owner process, so that an executor starting later removes
those of dead owners and never those of a live one (see `owners`).

The program and its extra files are mounted read-only at /sandbox and copied
into /work; the input dir is mounted read-only at /work/input (a readable
plain copy is mounted instead when the unprivileged user could not read it or
it holds links; a link leaving it is refused, see `files.input_files`).
Output files come back through `tar` run inside the container, which archives
links and hard links as such: only regular files are returned. Bind mounts
name paths on the engine's machine, so a remote engine (DOCKER_HOST) needs
them on a shared filesystem. An exit code above 128 is read as a signal.
When the wrapper around the program dies first (the program killed it, or
the OOM killer picked it in a fork bomb), what it left may hold the output
stream open: after `STREAM_GRACE_S` the container is stopped and the result
is the wrapper's status ("killed"), without output files.

With `gpus=...` each container also gets GPUs through the engine's device
requests, and nothing else changes (see `gpus` for what is enforced); where
the engine has no GPU runtime every run is an "infra_error" saying so.
"""

import logging
import math
import os
import shutil
import tarfile
import tempfile
import threading
import time
import uuid

from wmrl_jax.sandbox import container_io, owners
from wmrl_jax.sandbox import gpus as gpus_lib
from wmrl_jax.sandbox.files import InputError, input_files
from wmrl_jax.sandbox.result import (
    INPUT_NAME,
    OUTPUT_NAME,
    PROGRAM_NAME,
    BaseExecutor,
    ExecutionResult,
    InfraError,
    Limits,
    check_files,
    check_input_dir,
    check_timeout,
    infra_error,
)

log = logging.getLogger(__name__)

# Reads of the output archive before a run is an infra_error (see `_collect_outputs`).
OUTPUT_READS = 3

WORK_DIR = "/work"
CODE_DIR = "/sandbox"  # the program and its files, mounted read-only, copied into /work
# Copying into the tmpfs work dir (the root filesystem is read-only, so the
# engine cannot put files there before the start) costs a few milliseconds.
# Once the program exits, `kill -9 -1` (as the program's uid, which the
# container's sleeping main process does not share) ends every process it left.
COMMAND = (
    f"cp -R {CODE_DIR}/. . && mkdir -p {OUTPUT_NAME} || exit 125; "
    f"python3 {PROGRAM_NAME}; code=$?; kill -9 -1 2>/dev/null; exit $code"
)
# How long the output stream may outlive the program's wrapper before what the
# program left is stopped with the container.
STREAM_GRACE_S = 2.0
# How much longer than the host-side timeout the container's main process
# sleeps: output collection fits in it, and a container whose owner was
# SIGKILLed stops by itself after it.
KEEPER_GRACE_S = 30.0
USER = 65534  # nobody in Debian: the program's user
KEEPER_USER = 65533  # the container's main process (it only sleeps)
LABEL = owners.LABEL
ENGINE_HINT = (
    "start an engine (launch/docker_engine.sh start), point DOCKER_HOST at one, "
    "or use LocalExecutor"
)


_ENV = {
    "HOME": WORK_DIR,
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "WMRL_INPUT_DIR": f"{WORK_DIR}/{INPUT_NAME}",
    "WMRL_OUTPUT_DIR": f"{WORK_DIR}/{OUTPUT_NAME}",
}


def _stopped(container) -> bool:
    """Whether a program's container stopped under it, or no engine answers for it."""
    if container is None:
        return False
    try:
        container.reload()
    except Exception:  # no engine answers, or it removed the container
        return True
    return not container.attrs["State"]["Running"]


def _exit_status(code: int | None, *, timed_out: bool, oom: bool) -> str:
    """The result status from the exit code (negative: killed by that signal)."""
    if timed_out:
        return "timeout"
    if code == 0:
        return "ok"
    if oom:
        return "oom"
    if code is not None and code < 0:
        return "killed"
    return "error"


class DockerExecutor(BaseExecutor):
    """Runs each program in its own locked-down container (see the module docstring).

    Example:
        >>> ex = DockerExecutor(timeout_s=30)  # doctest: +SKIP
        >>> ex.run("import sklearn; print(sklearn.__version__)").stdout
        '1.5.2\\n'

    Args:
        image: the sandbox image; default `wmrl-sandbox:<version>`, built by
            `python -m wmrl_jax.sandbox.image`. Any image with python3 works.
        limits: resource limits (`Limits`); with GPUs the default is `gpus.GPU_LIMITS`
            (32 GiB of memory, 4 CPUs or the engine's number if fewer, 4096
            processes and threads, 2 GiB tmpfs).
        timeout_s: default wall-clock timeout, enforced from the host.
        max_workers: threads behind `submit`.
        client: a `docker.DockerClient`; default `docker.from_env()`.
        api_timeout_s: timeout of each engine API call.
        gpus: GPUs of each container (see `gpus.parse_gpus`): None or 0 for
            none, a count n (devices 0..n-1), "all", or device ids ("0,1",
            ["GPU-..."]). With GPUs the default image is the CUDA variant
            (`python -m wmrl_jax.sandbox.image --variant=cuda`). GPU programs
            need more processes (threads) and memory than CPU programs.
        gpus_per_program: hand each running program its own `gpus_per_program`
            of the `gpus` devices (disjoint, waiting while all are taken);
            None: every program gets all of `gpus`, shared.
        gpu_memory_fraction: advisory per-program cap on each device's memory
            (`XLA_PYTHON_CLIENT_MEM_FRACTION` and `WMRL_GPU_MEMORY_FRACTION` in
            the program's environment); None leaves the frameworks' defaults.
        probe_gpus: start one probe container with the GPU request now, so that
            an engine without a GPU runtime is known before any run
            (`gpu_refusal`); runs whose start fails are answered the same way.

    Attributes:
        gpu_refusal: why the engine cannot give containers the requested GPUs,
            or None; when set, every `run` returns an "infra_error" with it.

    Raises:
        InfraError: no engine answers, or the image is missing.
        ValueError, TypeError: a bad `gpus`, `gpus_per_program` or `gpu_memory_fraction`.
    """

    def __init__(
        self,
        image: str | None = None,
        *,
        limits: Limits | None = None,
        timeout_s: float = 60.0,
        max_workers: int | None = None,
        client=None,
        api_timeout_s: float = 600.0,
        gpus=None,
        gpus_per_program: int | None = None,
        gpu_memory_fraction: float | None = None,
        probe_gpus: bool = True,
    ):
        import docker

        super().__init__(max_workers=max_workers)
        self.gpus = gpus_lib.parse_gpus(gpus)
        self.gpu_memory_fraction = gpus_lib.check_memory_fraction(gpu_memory_fraction)
        self._leases = None
        groups = [self.gpus]
        if gpus_per_program is not None:
            if self.gpus is None:
                raise ValueError("gpus_per_program needs gpus")
            groups = gpus_lib.split_devices(self.gpus, gpus_per_program)
            self._leases = gpus_lib.GpuLeases(groups)
        if image is None:
            # Imported here so that `python -m wmrl_jax.sandbox.image` finds it unloaded.
            from wmrl_jax.sandbox.image import default_image

            image = default_image("cpu" if self.gpus is None else "cuda")
        self.image = image
        self.limits = limits or Limits()
        self.timeout_s = check_timeout(timeout_s)
        try:
            self.client = client or docker.from_env(timeout=int(api_timeout_s))
            self.client.ping()
        except Exception as e:
            raise InfraError(f"no Docker engine answers ({e}); {ENGINE_HINT}") from e
        try:
            image_id = self.client.images.get(self.image).id
        except docker.errors.ImageNotFound as e:
            variant = "" if self.gpus is None else " --variant=cuda"
            raise InfraError(
                f"image {self.image} is missing; build it with"
                f" `python -m wmrl_jax.sandbox.image{variant}` (or pass an image that has python3)"
            ) from e
        self.environment = f"docker:{self.image}@{image_id}"
        if self.gpus is not None and limits is None:
            self.limits = gpus_lib.gpu_limits(self.client)
        if self.gpus is not None:  # a program may behave differently with a GPU
            per = f"/{gpus_per_program}" if gpus_per_program else ""
            self.environment += f"+gpus={self.gpus.spec()}{per}"
        # Labels this executor's containers, so that leftovers can be found.
        self.token = uuid.uuid4().hex
        self._live: set[str] = set()
        self._lock = threading.Lock()
        self._closing = False
        self._evicted: set[str] = set()  # containers close() removed under a run
        owners.remove_at_exit(self)
        owners.reap(self.client)  # what killed trainers left on this engine
        self.gpu_refusal: str | None = None
        if self.gpus is not None and probe_gpus:
            self.gpu_refusal = gpus_lib.gpu_refusal(
                self.client, self.image, groups[0],
                labels=owners.owner_labels(self.token, time.time() + api_timeout_s),
            )  # fmt: skip
            if self.gpu_refusal:
                log.warning("every run will be an infra_error: %s", self.gpu_refusal)

    def _host_config(self, input_dir, code_dir: str, gpu=None, timeout_s: float = 60.0) -> dict:
        """`containers.create` keywords; `gpu` (a `gpus.GpuRequest`) adds its device request.

        The main process lives `timeout_s + KEEPER_GRACE_S` seconds, then the container stops.
        """
        import docker

        lim = self.limits
        # Mount objects, not "src:dst:mode" strings: a path may hold ':'.
        mounts = [docker.types.Mount(CODE_DIR, code_dir, type="bind", read_only=True)]
        if input_dir is not None:
            mounts.append(
                docker.types.Mount(
                    f"{WORK_DIR}/{INPUT_NAME}", input_dir, type="bind", read_only=True
                )
            )
        lifetime = math.ceil(timeout_s + KEEPER_GRACE_S)
        return dict(
            command=["sleep", str(lifetime)],
            user=f"{KEEPER_USER}:{KEEPER_USER}",
            working_dir=WORK_DIR,
            network_mode="none",
            mem_limit=lim.memory_bytes,
            memswap_limit=lim.memory_bytes,
            pids_limit=lim.pids,
            nano_cpus=int(lim.cpus * 1e9),
            read_only=True,
            tmpfs={
                "/tmp": f"rw,nosuid,nodev,size={lim.tmp_bytes},mode=1777",
                WORK_DIR: f"rw,nosuid,nodev,size={lim.work_bytes},uid={USER},gid={USER},mode=0755",
            },
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            init=True,
            ipc_mode="private",
            mounts=mounts,
            ulimits=[
                docker.types.Ulimit(
                    name="fsize", soft=lim.file_size_bytes, hard=lim.file_size_bytes
                ),
                docker.types.Ulimit(name="core", soft=0, hard=0),
                docker.types.Ulimit(name="nofile", soft=1024, hard=1024),
            ],
            log_config=docker.types.LogConfig(type="none"),
            labels=owners.owner_labels(self.token, time.time() + lifetime),
            **(
                dict(device_requests=[gpu.device_request()])
                if gpu is not None
                else dict(environment=dict(gpus_lib.NO_GPU_ENV))
            ),
        )

    def run(self, source, *, input_dir=None, timeout_s=None, files=None) -> ExecutionResult:
        """Runs `source` in a fresh container; see `Executor.run`.

        Raises:
            ValueError: bad `files`, or `input_dir` is not a directory.
            InputError: `input_dir` holds a link that leaves it, or a special
                file (see `files.input_files`).
        """
        timeout = check_timeout(self.timeout_s if timeout_s is None else timeout_s)
        extra = check_files(files)
        check_input_dir(input_dir)
        if self.gpu_refusal is not None:
            if input_dir is not None:  # the caller's mistakes are still raised as such
                input_files(os.path.realpath(input_dir))
            return infra_error(self.gpu_refusal)
        if self._leases is None:
            return self._run(source, input_dir, timeout, extra, self.gpus)
        with self._leases.lease() as gpu:
            return self._run(source, input_dir, timeout, extra, gpu)

    def _run(self, source, input_dir, timeout: float, extra: dict, gpu) -> ExecutionResult:
        import docker

        start = time.monotonic()
        container = None
        code_dir = tempfile.mkdtemp(prefix="wmrl-docker-")
        try:
            staging = os.path.join(code_dir, "staging")
            os.mkdir(staging, 0o755)
            code = os.path.join(code_dir, "code")
            os.mkdir(code)
            container_io.write_code(code, {PROGRAM_NAME: source.encode(), **extra})
            config = self._host_config(
                container_io.readable_input(input_dir, staging), code, gpu, timeout
            )
            try:
                if self._closing:
                    return infra_error("the executor was closed before the run started")
                container = self.client.containers.create(self.image, **config)
                with self._lock:
                    self._live.add(container.id)
                if self._closing:  # close() may have listed the live ones before this one
                    return infra_error("the executor was closed before the run started")
                container.start()
            except docker.errors.APIError as e:
                if gpu is None or not gpus_lib.is_gpu_failure(e):
                    raise
                return infra_error(
                    gpus_lib.refusal_message(self.client, gpu, e),
                    wall_seconds=time.monotonic() - start,
                )
            env = {**_ENV, **gpus_lib.program_environment(gpu, self.gpu_memory_fraction)}
            return self._execute(container, start + timeout, start, env)
        except InputError:  # the caller's input, refused before anything ran
            raise
        except Exception as e:  # the program's failures are results; these are the engine's
            if self._closing or (container is not None and container.id in self._evicted):
                why = "the executor was closed during the run (its container was removed)"
            elif isinstance(e, docker.errors.APIError) and not _stopped(container):
                # The engine answered and the program's container runs: its words say why.
                why = f"the Docker engine refused a request during the run ({e})"
            else:  # the engine is gone, or it stopped the container (e.g. shutting down)
                why = f"Docker engine failed during the run ({type(e).__name__}: {e})"
                why += f"; {ENGINE_HINT}"
            return infra_error(why, wall_seconds=time.monotonic() - start)
        finally:  # also on KeyboardInterrupt
            if container is not None:
                self._remove(container.id)
                self._evicted.discard(container.id)
            shutil.rmtree(code_dir, ignore_errors=True)

    def _remove(self, container_id: str) -> None:
        try:
            self.client.api.remove_container(container_id, force=True)
        except Exception as e:
            if not owners.already_removed(e):
                log.warning("could not remove container %s: %s", container_id[:12], e)
                return  # kept in _live: close() tries again
        with self._lock:
            self._live.discard(container_id)

    def _execute(self, container, deadline: float, start: float, env: dict) -> ExecutionResult:
        import docker

        api = self.client.api
        exec_id = api.exec_create(
            container.id, ["/bin/sh", "-c", COMMAND], user=f"{USER}:{USER}", workdir=WORK_DIR,
            environment=env,
        )["Id"]  # fmt: skip
        stream = container_io.OutputStream(api, exec_id, self.limits.tail_bytes)
        timed_out = not container_io.wait_exec(api, exec_id, stream.reader, deadline)
        stranded = False
        if not timed_out:  # the wrapper killed what the program left: the stream ends
            stream.reader.join(max(STREAM_GRACE_S, deadline - time.monotonic()))
            # Unless the wrapper itself died first (the program killed it, or the
            # OOM killer picked it in a fork bomb): processes it left hold the stream.
            stranded = stream.reader.is_alive()
            if stream.failure and not stranded:
                raise RuntimeError(f"lost the program's output stream ({stream.failure[0]!r})")
        if timed_out or stranded:
            try:
                container.kill()
            except docker.errors.APIError as e:  # it may have exited at the deadline
                if e.status_code != 409:
                    raise
        info = api.exec_inspect(exec_id)
        container.reload()
        if not (timed_out or stranded) and not container.attrs["State"]["Running"]:
            # The program cannot stop the container (its main process runs under
            # another uid): the engine did, e.g. while shutting down.
            raise RuntimeError("the container stopped under the program")
        cpu, peak, oom_kills = container_io.cgroup_stats(container.id)
        files, dropped = {}, []
        if not (timed_out or stranded):
            files, dropped = self._collect_outputs(container)
        if stream.reader.is_alive():
            stream.reader.join(5.0)
        code = info.get("ExitCode")
        if code is not None and code > 128:  # killed by signal (code - 128)
            code = 128 - code
        oom = bool(oom_kills) or (code == -9 and self._oom(container))
        message = (
            "the program's wrapper died and left processes running; the container was"
            " stopped and output files were not collected"
            if stranded
            else f"output files left out: {', '.join(dropped)}"
            if dropped
            else ""
        )
        return ExecutionResult(
            status=_exit_status(code, timed_out=timed_out, oom=oom),
            exit_code=code,
            wall_seconds=time.monotonic() - start,
            cpu_seconds=cpu,
            peak_memory_bytes=peak,
            stdout=stream.out.text(),
            stderr=stream.err.text(),
            stdout_truncated=stream.out.truncated,
            stderr_truncated=stream.err.truncated,
            files=files,
            message=message,
        )

    def _collect_outputs(self, container) -> tuple[dict[str, bytes], list[str]]:
        """The program's output files, through tar inside the container (the engine's
        archive API does not see tmpfs mounts)."""
        api = self.client.api
        for attempt in range(1, OUTPUT_READS + 1):
            tar_id = api.exec_create(
                container.id,
                # --sparse: a file's holes are not sent (a sparse 200 MiB file costs nothing)
                ["tar", "--sparse", "-C", WORK_DIR, "-cf", "-", OUTPUT_NAME],
                user=f"{USER}:{USER}",
                stderr=False,
            )["Id"]
            chunks = (o for o, _ in api.exec_start(tar_id, stream=True, demux=True) if o)
            try:
                return container_io.untar_outputs(chunks, self.limits.output_bytes)
            except tarfile.ReadError as e:
                # The engine can lose a short exec's output (it ended before its stream
                # was attached; seen under load as an empty archive). The files are
                # still there: read them again, a bounded number of times.
                if attempt == OUTPUT_READS:
                    raise RuntimeError(
                        f"the output archive came back unreadable {attempt} times ({e})"
                    ) from e
                log.warning("output archive unreadable (%s); reading it again", e)

    @staticmethod
    def _oom(container) -> bool:
        """The engine's OOM flag, for engines whose cgroups this host cannot read."""
        container.reload()
        return bool(container.attrs.get("State", {}).get("OOMKilled"))

    def close(self) -> None:
        """Stops and removes every container this executor started, also those of
        programs still running (their runs end as "infra_error"), then waits for the
        submitted runs. The executor can run programs again afterwards."""
        self._closing = True
        try:
            self.remove_containers()
            super().close()
            self.remove_containers()  # a run that created its container meanwhile
        finally:
            self._closing = False

    def remove_containers(self) -> None:
        """Removes (force) every container of this executor, running or not; runs
        still in flight end as "infra_error" (`owners.remove_at_exit` calls it)."""
        with self._lock:
            leftovers = set(self._live)
        try:  # also those whose creation the engine finished but never confirmed
            labelled = self.client.api.containers(
                all=True, filters={"label": f"{LABEL}={self.token}"}
            )
            leftovers.update(c["Id"] for c in labelled)
        except Exception as e:
            log.warning("could not list this executor's containers: %s", e)
        for container_id in leftovers:
            with self._lock:
                self._evicted.add(container_id)
            self._remove(container_id)
