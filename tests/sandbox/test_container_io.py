"""Host-side container I/O without an engine: the output archive and the input mount."""

import io
import os
import tarfile

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


def test_an_archive_far_over_the_cap_is_dropped_whole():
    files, dropped = container_io.untar_outputs(_archive([("f", b"z" * (3 << 20))]), 1 << 20)
    assert files == {} and dropped == [f"all (archive over {1 << 20} bytes)"]


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
