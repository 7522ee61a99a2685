"""File handling at the boundary without any program: inputs, outputs, removal, staging."""

import os
import pathlib
import shutil
import stat
import subprocess
import sys
import tempfile

import pytest

from wmrl_jax.sandbox import InfraError, InputError, interpreter
from wmrl_jax.sandbox.files import (
    MAX_OUTPUT_DEPTH,
    copy_input,
    input_files,
    read_output,
    remove_tree,
)


def _read(parent, name="output", max_bytes=1 << 20, owner=None):
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return read_output(fd, name, max_bytes, owner=owner)
    finally:
        os.close(fd)


def _nest(root, depth, name="d"):
    """`depth` nested directories under `root`, made through descriptors (no long paths)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir(name, dir_fd=fd)
        child = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    with open(os.open("leaf.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as f:
        f.write("deep")
    os.close(fd)


def test_read_output_refuses_links_hard_links_and_special_files(tmp_path):
    out = tmp_path / "output"
    out.mkdir()
    (out / "ok.txt").write_text("fine")
    outside = tmp_path / "outside.txt"
    outside.write_text("not yours")
    os.link(outside, out / "hard.txt")
    os.mkfifo(out / "pipe")  # opening it would block: it must not be opened
    (out / "dirlink").symlink_to(tmp_path, target_is_directory=True)
    files, dropped = _read(tmp_path)
    assert files == {"ok.txt": b"fine"}
    assert sorted(d.split()[0] for d in dropped) == ["dirlink", "hard.txt", "pipe"]
    files, dropped = _read(tmp_path, owner=os.getuid() + 1)
    assert files == {} and "ok.txt (hard link or not the program's file)" in dropped


def test_read_output_when_output_is_a_link_or_missing(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "secret.txt").write_text("x")
    (tmp_path / "output").symlink_to(tmp_path / "real", target_is_directory=True)
    assert _read(tmp_path) == ({}, ["output/ (a link or not a directory)"])
    assert _read(tmp_path, name="absent") == ({}, [])


@pytest.fixture
def fast_tmp(tmp_path):
    """A memory-backed temp dir where there is one (deleting 5000 directories on a disk
    that discards online takes seconds)."""
    if not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK):
        yield tmp_path
        return
    path = tempfile.mkdtemp(prefix="wmrl-files-test-", dir="/dev/shm")
    yield pathlib.Path(path)
    remove_tree(path)


def test_deep_trees_are_bounded_and_removed(fast_tmp):
    tmp_path = fast_tmp
    out = tmp_path / "work" / "output"
    out.mkdir(parents=True)
    _nest(out, 3)
    _nest(out, 5000, name="e")  # deeper than the recursion limit and PATH_MAX
    files, dropped = _read(tmp_path / "work")
    assert files == {"d/d/d/leaf.txt": b"deep"}
    assert any(f"deeper than {MAX_OUTPUT_DEPTH} levels" in d for d in dropped)
    os.chmod(out / "d", 0o500)  # a read-only directory is emptied too
    remove_tree(str(tmp_path / "work"))
    assert not os.path.exists(tmp_path / "work")


def test_input_files_and_copy(tmp_path):
    src = tmp_path / "public"
    (src / "sub").mkdir(parents=True)
    (src / "empty").mkdir()
    (src / "a.csv").write_text("a")
    (src / "sub" / "b.csv").write_text("b")
    (src / "alias.csv").symlink_to("sub/b.csv")
    assert [rel for rel, _ in input_files(src)] == ["a.csv", "alias.csv", "sub/b.csv"]
    target = tmp_path / "copy"
    copy_input(src, str(target), file_mode=0o444, dir_mode=0o555)
    assert (target / "alias.csv").read_text() == "b" and not (target / "alias.csv").is_symlink()
    assert (target / "empty").is_dir()
    assert stat.S_IMODE(os.stat(target / "sub").st_mode) == 0o555
    assert stat.S_IMODE(os.stat(target / "a.csv").st_mode) == 0o444
    for bad in ("../outside", "sub", "missing"):
        (src / "bad").symlink_to(bad)
        with pytest.raises(InputError, match="'bad'"):
            input_files(src)
        os.remove(src / "bad")
    os.mkfifo(src / "pipe")
    with pytest.raises(InputError, match="'pipe'"):
        copy_input(src, str(tmp_path / "copy2"), file_mode=0o444, dir_mode=0o555)
    assert not os.path.exists(tmp_path / "copy2")


@pytest.fixture
def stage_root():
    """A stage root every uid can traverse (pytest's own temp dirs are root-only)."""
    path = tempfile.mkdtemp(prefix="wmrl-stage-test-")
    os.chmod(path, 0o755)
    yield os.path.join(path, "stages")
    remove_tree(path)


@pytest.mark.skipif(os.geteuid() != 0, reason="staging is for the root caller")
def test_staged_interpreter_runs_as_an_unprivileged_uid(stage_root, monkeypatch):
    """Forced staging of this interpreter (whatever its location): it starts as uid
    65534 and imports numpy from the environment's site-packages."""
    base = os.path.realpath(sys.base_prefix) + os.sep
    reachable = interpreter.reachable
    # The base interpreter counts as unreachable; a venv's site-packages keeps its own answer.
    monkeypatch.setattr(
        interpreter,
        "reachable",
        lambda path: reachable(path) and not os.path.realpath(path).startswith(base),
    )
    staged = interpreter.stage_interpreter(sys.executable, root=stage_root)
    assert staged.executable.startswith(stage_root)
    out = subprocess.run(
        [staged.executable, "-c", "import sys, numpy; print(sys.prefix, numpy.ones(2).sum())"],
        env={"PATH": "/usr/bin:/bin", **staged.env},
        user=65534,
        group=65534,
        extra_groups=[],
        cwd="/",
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[1] == "2.0" and out.stdout.startswith(stage_root)
    # A second caller reuses the stage; a damaged stage is rebuilt.
    assert interpreter.stage_interpreter(sys.executable, root=stage_root) == staged
    stage = os.path.dirname(os.path.dirname(os.path.dirname(staged.executable)))
    shutil.rmtree(os.path.join(stage, "base", "lib"))
    assert interpreter.stage_interpreter(sys.executable, root=stage_root) == staged
    assert interpreter.check_runs(staged) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="staging is for the root caller")
def test_stage_root_writable_by_others_is_refused(stage_root, monkeypatch):
    monkeypatch.setattr(interpreter, "reachable", lambda path: False)
    os.makedirs(stage_root, 0o777)
    os.chmod(stage_root, 0o777)
    with pytest.raises(InfraError, match="nobody else can write"):
        interpreter.stage_interpreter(sys.executable, root=stage_root)


def test_output_walk_is_bounded_in_entries(fast_tmp):
    from wmrl_jax.sandbox.files import MAX_OUTPUT_ENTRIES

    out = fast_tmp / "output"
    out.mkdir()
    for i in range(MAX_OUTPUT_ENTRIES + 10):
        (out / f"f{i:05d}").write_bytes(b"")
    files, dropped = _read(fast_tmp)
    assert len(files) == MAX_OUTPUT_ENTRIES
    assert dropped == [f"entries past the first {MAX_OUTPUT_ENTRIES}"]


def test_output_that_is_a_fifo_is_not_opened(tmp_path):
    os.mkfifo(tmp_path / "output")
    assert _read(tmp_path) == ({}, ["output/ (a link or not a directory)"])


def test_ray_inputs_are_packed_by_the_same_rules(tmp_path):
    import io
    import tarfile

    from wmrl_jax.sandbox.ray_executor import pack_dir

    root = tmp_path / "public"
    (root / "sub").mkdir(parents=True)
    (root / "train.csv").write_text("a\n1\n")
    (root / "sub" / "alias.csv").symlink_to(root / "train.csv")  # inside: a plain copy
    with tarfile.open(fileobj=io.BytesIO(pack_dir(root))) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert set(members) == {"train.csv", "sub/alias.csv"}
        assert all(m.isfile() for m in members.values())
        assert tar.extractfile("sub/alias.csv").read() == b"a\n1\n"
    (tmp_path / "secret.csv").write_text("answers")
    (root / "leak.csv").symlink_to(tmp_path / "secret.csv")  # leaves the input dir
    with pytest.raises(InputError, match="leak.csv"):
        pack_dir(root)
