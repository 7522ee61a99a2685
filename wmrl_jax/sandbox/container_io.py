"""Host-side I/O of a sandbox container: its input mount, code, outputs, streams and cgroups.

What `DockerExecutor` does around one container: decide whether the input dir
can be mounted as it is or needs a readable copy, write the program for the
container's unprivileged user, read the exec's output streams on a thread,
wait for the exec against a deadline, unpack the output archive (regular files
only, capped) and read the container's CPU, peak memory and OOM kills from the
cgroup files where the engine is local.
"""

import io
import os
import stat
import tarfile
import threading
import time

from wmrl_jax.sandbox.files import MAX_OUTPUT_ENTRIES, copy_input, input_files
from wmrl_jax.sandbox.result import TailBuffer


def _world_readable(root: str) -> bool:
    """Whether the container's unprivileged user can read every file under `root`."""
    for dirpath, _, filenames in os.walk(root):
        if os.stat(dirpath).st_mode & (stat.S_IROTH | stat.S_IXOTH) != (
            stat.S_IROTH | stat.S_IXOTH
        ):
            return False
        for name in filenames:
            if not os.stat(os.path.join(dirpath, name)).st_mode & stat.S_IROTH:
                return False
    return True


def readable_input(input_dir, staging: str) -> str | None:
    """`input_dir`'s real path when it can be mounted as is, else a readable plain copy.

    Mounted as is only when world-readable and free of links (a link would be
    resolved inside the container, where its host target does not exist).

    Raises:
        InputError: `input_dir` holds a link leaving it (see `files.input_files`).
    """
    if input_dir is None:
        return None
    real = os.path.realpath(input_dir)
    entries = input_files(real)
    if all(path == os.path.join(real, rel) for rel, path in entries) and _world_readable(real):
        return real
    target = os.path.join(staging, "input")
    copy_input(real, target, file_mode=0o644, dir_mode=0o755)
    return target


def _cgroup_file(container_id: str, names: tuple[str, ...]) -> str | None:
    """First readable cgroup file of the container on this host (v1 cgroupfs/systemd, v2)."""
    for base in (f"docker/{container_id}", f"system.slice/docker-{container_id}.scope"):
        for name in names:
            for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/memory", "/sys/fs/cgroup/cpuacct"):
                path = os.path.join(root, base, name)
                try:
                    with open(path) as f:
                        return f.read()
                except OSError:
                    continue
    return None


def cgroup_stats(container_id: str) -> tuple[float | None, int | None, int]:
    """(cpu seconds, peak memory bytes, OOM kills) where the engine is local, else Nones."""
    cpu = peak = None
    oom_kills = 0
    if (text := _cgroup_file(container_id, ("cpuacct.usage",))) is not None:
        cpu = int(text) / 1e9
    elif (text := _cgroup_file(container_id, ("cpu.stat",))) is not None:
        usage = dict(line.split() for line in text.splitlines() if line)
        cpu = int(usage.get("usage_usec", 0)) / 1e6
    if (
        text := _cgroup_file(container_id, ("memory.max_usage_in_bytes", "memory.peak"))
    ) is not None:
        peak = int(text)
    if (text := _cgroup_file(container_id, ("memory.oom_control", "memory.events"))) is not None:
        fields = dict(line.split() for line in text.splitlines() if line)
        oom_kills = int(fields.get("oom_kill", 0))
    return cpu, peak, oom_kills


def write_code(root: str, entries: dict[str, bytes]) -> None:
    """The program and its files, readable by the container's unprivileged user."""
    os.chmod(root, 0o755)
    for name, data in entries.items():
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        os.chmod(path, 0o644)


class _ChunkReader(io.RawIOBase):
    """A readable file over an iterator of byte chunks (the exec's stream)."""

    def __init__(self, chunks):
        self._chunks, self._pending = iter(chunks), b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._pending:
            self._pending = next(self._chunks, None)
            if self._pending is None:
                self._pending = b""
                return 0
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n


def untar_outputs(chunks, max_bytes: int) -> tuple[dict[str, bytes], list[str]]:
    """Regular files of the `output` archive (links never followed), capped at `max_bytes`.

    The archive is read as a stream: a file that does not fit what is left of
    `max_bytes` is skipped, never held, and named in the second list; the files
    that fit are kept. At most `files.MAX_OUTPUT_ENTRIES` entries are read.
    """
    files, dropped, budget = {}, [], max_bytes
    stream = io.BufferedReader(_ChunkReader(chunks), 1 << 16)
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for count, member in enumerate(tar):
            if count >= MAX_OUTPUT_ENTRIES:
                dropped.append(f"the rest (over {MAX_OUTPUT_ENTRIES} entries)")
                break
            rel = member.name.partition("/")[2]
            if member.isdir() or not rel:
                continue
            if not member.isreg():
                dropped.append(f"{rel} (link or special file)")
            elif member.size > budget:
                dropped.append(f"{rel} (over the {max_bytes} byte output cap)")
            else:
                files[rel] = tar.extractfile(member).read()
                budget -= member.size
    return files, dropped


class OutputStream:
    """Reads an exec's demultiplexed output into two tail buffers on a daemon thread."""

    def __init__(self, api, exec_id: str, tail_bytes: int):
        self.out, self.err = TailBuffer(tail_bytes), TailBuffer(tail_bytes)
        self.failure: list[BaseException] = []
        self.reader = threading.Thread(target=self._consume, args=(api, exec_id), daemon=True)
        self.reader.start()

    def _consume(self, api, exec_id: str) -> None:
        try:
            for chunk_out, chunk_err in api.exec_start(exec_id, stream=True, demux=True):
                if chunk_out:
                    self.out.write(chunk_out)
                if chunk_err:
                    self.err.write(chunk_err)
        except Exception as e:  # a killed container ends the stream abruptly
            self.failure.append(e)


def wait_exec(api, exec_id: str, reader: threading.Thread, deadline: float) -> bool:
    """Waits for the exec to end; False when `deadline` (monotonic) passed first.

    The stream can end before the process (closed stdout) or outlive it (a child
    holding the pipe): the exec's state decides. An exec the reader has not
    started yet is not running either, but has no exit code: it has not ended
    until it has one, or until the reader gave up (the start failed).
    """
    interval = 0.005
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        reader.join(min(remaining, interval))
        interval = min(2 * interval, 0.1)
        state = api.exec_inspect(exec_id)
        if not state["Running"] and (state.get("ExitCode") is not None or not reader.is_alive()):
            return True
