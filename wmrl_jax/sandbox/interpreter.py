"""An interpreter that the local sandbox's unprivileged user ids can run.

As root, `LocalExecutor` runs each program under a uid of its own. That uid
must be able to execute the interpreter and read its standard library and
site-packages, which often live under a private home directory (a pyenv
interpreter under `/root`, a virtual environment whose `python` links there).
Nothing on the host is made more accessible; instead `stage_interpreter`
builds, once per interpreter, a world-readable *staged* copy of exactly what
is unreachable:

    <tmp>/wmrl-sandbox-python/<digest>/base/bin/python3.X   # the interpreter binary
    <tmp>/wmrl-sandbox-python/<digest>/base/lib/python3.X/  # its standard library
    <tmp>/wmrl-sandbox-python/<digest>/base/lib/libpython…  # when built shared
    <tmp>/wmrl-sandbox-python/<digest>/venv/pyvenv.cfg      # for a virtual environment:
    <tmp>/wmrl-sandbox-python/<digest>/venv/lib/python3.X/site-packages  # -> the venv's own

Files are hard links where the filesystem allows (no copy; the files keep
their owner and mode, and group- or world-writable ones are copied read-only
instead), else copies. A site-packages directory that the uid can reach is
linked to, not copied. The standard library's `test/`, `config-*/` and the
base interpreter's own `site-packages/` (unused by a venv) are left out.
The staged tree belongs to root and is not writable by anyone else; the
digest covers the interpreter's paths, size and modification time, so a
changed interpreter gets a fresh stage.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
from typing import NamedTuple

from wmrl_jax.sandbox.files import remove_tree
from wmrl_jax.sandbox.result import InfraError

STAGE_ROOT = os.path.join(tempfile.gettempdir(), "wmrl-sandbox-python")
# A uid with no privileges, to check that a staged interpreter really runs.
CHECK_UID = 65534
_SKIPPED = ("test", "site-packages")
_QUERY = (
    "import json, sys, sysconfig\n"
    "v = sysconfig.get_config_var\n"
    "print(json.dumps({'executable': sys.executable, 'prefix': sys.prefix,\n"
    "  'base_prefix': sys.base_prefix, 'version': sysconfig.get_python_version(),\n"
    "  'stdlib': sysconfig.get_path('stdlib'), 'dynload': v('DESTSHARED'),\n"
    "  'site': sysconfig.get_path('purelib'), 'platsite': sysconfig.get_path('platlib'),\n"
    "  'shared': bool(v('Py_ENABLE_SHARED')), 'libdir': v('LIBDIR'),\n"
    "  'soname': v('INSTSONAME')}))\n"
)


class Interpreter(NamedTuple):
    """How to start an interpreter: its path and the environment it needs (e.g. a library path)."""

    executable: str
    env: dict[str, str]


def reachable(path: str) -> bool:
    """Whether a user with no privileges can reach and read `path` (no link is trusted)."""
    for candidate in {os.path.abspath(path), os.path.realpath(path)}:
        parts = candidate.split(os.sep)
        for i in range(2, len(parts)):
            try:
                if not os.stat(os.sep.join(parts[:i])).st_mode & stat.S_IXOTH:
                    return False
            except OSError:
                return False
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) or mode & stat.S_IXUSR else 0)
    return mode & need == need


def _query(python: str) -> dict:
    try:
        out = subprocess.run(
            [python, "-I", "-c", _QUERY], capture_output=True, text=True, timeout=60, check=True
        )
        return json.loads(out.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        raise InfraError(f"cannot run the sandbox interpreter {python!r}: {e}") from e


def _site_dirs(info: dict) -> list[str]:
    return sorted({info["site"], info["platsite"]} - {None})


def _needed(info: dict) -> list[str]:
    paths = [info["executable"], info["stdlib"], info["dynload"], *_site_dirs(info)]
    if info["shared"]:
        paths.append(os.path.join(info["libdir"], info["soname"]))
    return [p for p in paths if p and os.path.exists(p)]


def _place(src: str, dst: str) -> None:
    """A hard link to `src` at `dst`, or a read-only copy (other filesystem, writable file)."""
    mode = os.stat(src).st_mode
    if not mode & (stat.S_IWGRP | stat.S_IWOTH):
        try:
            os.link(os.path.realpath(src), dst)
            return
        except OSError:
            pass
    shutil.copy2(src, dst)
    os.chmod(dst, stat.S_IMODE(mode) & ~(stat.S_IWGRP | stat.S_IWOTH))


def _mirror(src: str, dst: str, *, skip: tuple[str, ...] = ()) -> None:
    """`src`'s files placed under `dst`; links to files become files, links to dirs are skipped."""
    for dirpath, dirnames, filenames in os.walk(src):
        rel = os.path.relpath(dirpath, src)
        if rel == ".":
            dirnames[:] = [d for d in dirnames if d not in skip and not d.startswith("config-")]
        target = os.path.normpath(os.path.join(dst, rel))
        os.makedirs(target, 0o755, exist_ok=True)
        for name in filenames:
            path = os.path.join(dirpath, name)
            if os.path.isfile(path):  # dangling links and special files are left out
                _place(path, os.path.join(target, name))


def _digest(python: str, info: dict) -> str:
    binary = os.stat(info["executable"])
    key = [python, info, binary.st_size, binary.st_mtime_ns]
    key += [os.stat(d).st_mtime_ns for d in _site_dirs(info) if os.path.isdir(d)]
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]


def _safe_root(root: str) -> None:
    os.makedirs(root, 0o755, exist_ok=True)
    info = os.lstat(root)
    if (
        not stat.S_ISDIR(info.st_mode)
        or info.st_uid != os.geteuid()
        or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    ):
        raise InfraError(
            f"{root} must be a directory of uid {os.geteuid()} that nobody else can write; "
            "remove it and retry"
        )
    os.chmod(root, 0o755)


def _build(info: dict, stage: str, final: str) -> None:
    """Builds the stage in directory `stage`, to be renamed to `final`."""
    version = info["version"]
    base = os.path.join(stage, "base")
    os.makedirs(os.path.join(base, "bin"), 0o755)
    _place(info["executable"], os.path.join(base, "bin", f"python{version}"))
    stdlib = os.path.join(base, "lib", f"python{version}")
    _mirror(info["stdlib"], stdlib, skip=_SKIPPED)
    dynload = os.path.join(stdlib, "lib-dynload")
    if info["dynload"] and not os.path.isdir(dynload):
        _mirror(info["dynload"], dynload)
    if info["shared"]:
        _place(
            os.path.join(info["libdir"], info["soname"]),
            os.path.join(base, "lib", info["soname"]),
        )
    venv = info["prefix"] != info["base_prefix"]
    home = os.path.join(stage, "venv") if venv else base
    if venv:
        os.makedirs(os.path.join(home, "bin"), 0o755)
        os.symlink(
            os.path.join("..", "..", "base", "bin", f"python{version}"),
            os.path.join(home, "bin", "python"),
        )
        with open(os.path.join(home, "pyvenv.cfg"), "w") as f:
            f.write(
                f"home = {os.path.join(final, 'base', 'bin')}\n"
                "include-system-site-packages = false\n"
                f"version = {version}\n"
            )
    site = os.path.join(home, "lib", f"python{version}", "site-packages")
    os.makedirs(os.path.dirname(site), 0o755, exist_ok=True)
    if reachable(info["site"]):
        os.symlink(info["site"], site)
    else:
        _mirror(info["site"], site)
    if info["platsite"] != info["site"] and info["platsite"] and os.path.isdir(info["platsite"]):
        raise InfraError(f"cannot stage separate platform site-packages {info['platsite']}")
    for dirpath, _, _ in os.walk(stage):
        os.chmod(dirpath, 0o755)


def _staged(info: dict, stage: str) -> Interpreter:
    venv = info["prefix"] != info["base_prefix"]
    executable = (
        os.path.join(stage, "venv", "bin", "python")
        if venv
        else os.path.join(stage, "base", "bin", f"python{info['version']}")
    )
    env = {"LD_LIBRARY_PATH": os.path.join(stage, "base", "lib")} if info["shared"] else {}
    return Interpreter(executable, env)


def check_runs(interpreter: Interpreter, uid: int = CHECK_UID) -> str | None:
    """None when `interpreter` starts as `uid` with its site-packages, else the error."""
    try:
        out = subprocess.run(
            [interpreter.executable, "-c", "import site, encodings"],
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", **interpreter.env},
            user=uid,
            group=uid,
            extra_groups=[],
            cwd="/",
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as e:
        return repr(e)
    return None if out.returncode == 0 else out.stderr.strip()[-500:]


def stage_interpreter(python: str, *, root: str = STAGE_ROOT) -> Interpreter:
    """`python` itself when an unprivileged uid can run it, else a staged copy (module docstring).

    Must run as root. Concurrent callers (threads or processes) share one stage.

    Raises:
        InfraError: `python` does not run, or the stage cannot be built or does not run.
    """
    info = _query(python)
    if all(reachable(p) for p in _needed(info)):
        return Interpreter(info["executable"], {})
    _safe_root(root)
    stage = os.path.join(root, _digest(python, info))
    error = None
    for _ in range(2):  # a stage damaged since (a temp-dir cleaner) is built again, once
        if error is not None:
            remove_tree(stage)
        if not os.path.isdir(stage):
            _build_atomically(python, info, root, stage)
        interpreter = _staged(info, stage)
        if (error := check_runs(interpreter)) is None:
            return interpreter
    raise InfraError(f"the staged interpreter {interpreter.executable} does not run: {error}")


def _build_atomically(python: str, info: dict, root: str, stage: str) -> None:
    scratch = tempfile.mkdtemp(prefix=".build-", dir=root)
    try:
        _build(info, scratch, stage)
        os.chmod(scratch, 0o755)
        try:
            os.rename(scratch, stage)
        except OSError:  # another process staged it first
            if not os.path.isdir(stage):
                raise
    except OSError as e:
        raise InfraError(f"cannot stage {python} for the sandbox uids in {root}: {e}") from e
    finally:
        remove_tree(scratch)


def view_paths(python: str, interpreter: Interpreter) -> list[str]:
    """The directories a program run by `interpreter` must see (read-only) to start.

    For a staged interpreter: its stage and the site-packages it links to;
    otherwise the prefixes, standard library, extension modules and
    site-packages of `python` (a virtual environment's and its base's).
    """
    info = _query(python)
    stage_root = os.path.realpath(STAGE_ROOT) + os.sep
    if interpreter.executable.startswith(stage_root):  # staged: all of it is in the stage
        digest = interpreter.executable[len(stage_root) :].split(os.sep)[0]
        paths = [stage_root + digest, *(os.path.realpath(p) for p in _site_dirs(info))]
    else:
        paths = [info["prefix"], info["base_prefix"], *_needed(info)]
    out = []
    for path in paths:
        if path and os.path.exists(path):
            path = path if os.path.isdir(path) else os.path.dirname(path)
            out += [os.path.abspath(path), os.path.realpath(path)]
    return sorted(set(out))
