"""Host-side container I/O without an engine: the output archive, the input mount, the exec wait."""

import io
import os
import tarfile
import threading
import time

from wmrl_jax.sandbox import container_io


def _archive(members) -> list[bytes]:
    """A tar of `output/...` members as an engine streams it: (name, bytes or a link target)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        root = tarfile.TarInfo("output")
        root.type = tarfile.DIRTYPE
        tar.addfile(root)
        for name, data in members:
            info = tarfile.TarInfo(f"output/{name}")
            if isinstance(data, bytes):
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                info.type, info.linkname = tarfile.SYMTYPE, data
                tar.addfile(info)
    raw = buf.getvalue()
    return [raw[i : i + 1000] for i in range(0, len(raw), 1000)]


def test_only_regular_files_within_the_cap_come_back():
    chunks = _archive(
        [("a.txt", b"abc"), ("sub/b.bin", b"x" * 40), ("link", "/etc/passwd"), ("big", b"y" * 80)]
    )
    files, dropped = container_io.untar_outputs(chunks, max_bytes=60)
    assert files == {"a.txt": b"abc", "sub/b.bin": b"x" * 40}
    assert dropped == ["link (link or special file)", "big (over the 60 byte output cap)"]


def test_a_file_far_over_the_cap_is_dropped_alone():
    # Read as a stream: the big file is skipped, the submission after it is kept.
    chunks = _archive([("big", b"z" * (3 << 20)), ("submission.csv", b"id,y\n1,0\n")])
    files, dropped = container_io.untar_outputs(chunks, 1 << 20)
    assert files == {"submission.csv": b"id,y\n1,0\n"}
    assert dropped == [f"big (over the {1 << 20} byte output cap)"]


def test_entries_past_the_entry_cap_are_left_out():
    chunks = _archive([(f"f{i}", b"") for i in range(container_io.MAX_OUTPUT_ENTRIES + 5)])
    files, dropped = container_io.untar_outputs(chunks, 1 << 20)
    # The archive's first entry is the output dir itself.
    assert len(files) == container_io.MAX_OUTPUT_ENTRIES - 1
    assert dropped == [f"the rest (over {container_io.MAX_OUTPUT_ENTRIES} entries)"]


def test_input_is_mounted_as_is_only_when_readable_and_free_of_links(tmp_path):
    src, staging = tmp_path / "in", tmp_path / "staging"
    (src / "d").mkdir(parents=True)
    staging.mkdir()
    (src / "d" / "x.csv").write_text("1\n")
    os.chmod(src, 0o755)
    os.chmod(src / "d", 0o755)
    os.chmod(src / "d" / "x.csv", 0o644)
    assert container_io.readable_input(str(src), str(staging)) == os.path.realpath(src)
    os.chmod(src / "d" / "x.csv", 0o600)  # the container's user could not read it
    copy = container_io.readable_input(str(src), str(staging))
    assert copy == str(staging / "input")
    assert (staging / "input" / "d" / "x.csv").read_text() == "1\n"
    assert os.stat(staging / "input" / "d" / "x.csv").st_mode & 0o777 == 0o644
    assert container_io.readable_input(None, str(staging)) is None


def _cgroup(files: dict[str, str]):
    return lambda container_id, names: next((files[n] for n in names if n in files), None)


def test_cgroup_stats_read_v1_and_v2_files(monkeypatch):
    v1 = {
        "cpuacct.usage": "2500000000\n",
        "memory.max_usage_in_bytes": "1048576\n",
        "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
    }
    v2 = {
        "cpu.stat": "usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n",
        "memory.peak": "2097152\n",
        "memory.events": "low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n",
    }
    monkeypatch.setattr(container_io, "_cgroup_file", _cgroup(v1))
    assert container_io.cgroup_stats("c") == (2.5, 1 << 20, 1)
    monkeypatch.setattr(container_io, "_cgroup_file", _cgroup(v2))
    assert container_io.cgroup_stats("c") == (1.5, 2 << 20, 2)
    monkeypatch.setattr(container_io, "_cgroup_file", _cgroup({}))  # a remote engine
    assert container_io.cgroup_stats("c") == (None, None, 0)


class _Exec:
    """An engine's exec_inspect answers, one per call, the last one repeated."""

    def __init__(self, *states):
        self.states, self.calls = list(states), 0

    def exec_inspect(self, exec_id):
        self.calls += 1
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]


NOT_STARTED = {"Running": False, "ExitCode": None, "Pid": 0}
RUNNING = {"Running": True, "ExitCode": None, "Pid": 7}
EXITED = {"Running": False, "ExitCode": 0, "Pid": 7}


def _reader(alive: bool) -> tuple[threading.Thread, threading.Event]:
    done = threading.Event()
    reader = threading.Thread(target=done.wait, daemon=True)
    reader.start()
    if not alive:
        done.set()
        reader.join()
    return reader, done


def test_an_exec_not_started_yet_has_not_ended():
    # The reader thread starts the exec; polled before that, the engine reports it
    # not running and without an exit code. Reading that as "ended" made a busy
    # loop with a 1 s timeout come back "killed" instead of "timeout".
    api = _Exec(NOT_STARTED, NOT_STARTED, RUNNING, RUNNING, EXITED)
    reader, done = _reader(alive=True)
    try:
        assert container_io.wait_exec(api, "x", reader, time.monotonic() + 30)
        assert api.calls == 5
        api = _Exec(NOT_STARTED, RUNNING)
        start = time.monotonic()
        assert not container_io.wait_exec(api, "x", reader, start + 0.3)
        assert time.monotonic() - start >= 0.3
    finally:
        done.set()


def test_an_exec_whose_start_failed_has_ended():
    reader, _ = _reader(alive=False)  # the reader gave up: exec_start raised
    api = _Exec(NOT_STARTED)
    assert container_io.wait_exec(api, "x", reader, time.monotonic() + 30)
    assert api.calls == 1


def test_a_running_exec_waits_for_the_deadline():
    reader, done = _reader(alive=True)
    try:
        start = time.monotonic()
        assert not container_io.wait_exec(api := _Exec(RUNNING), "x", reader, start + 0.3)
        assert time.monotonic() - start >= 0.3 and api.calls > 1
    finally:
        done.set()
