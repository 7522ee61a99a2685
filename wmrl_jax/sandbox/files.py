"""Files crossing the sandbox boundary: inputs in, outputs out, work dirs removed.

Inputs: a directory given to a sandbox (a task's `public/`) may hold regular
files, directories and symbolic links that resolve to a regular file inside
it; `input_files` refuses anything else (a link leaving it, a link to a
directory, a FIFO or device) with an `InputError` naming the entry, so that no
backend ever copies or mounts what lies behind such a link.

Outputs: `read_output` collects a program's `output/` from a directory file
descriptor of the work dir that the sandbox created, opening every component
with `O_NOFOLLOW`: a program that replaces `output/` (or a directory inside
it) by a link, or that leaves a hard link to a file it does not own, gets
nothing through it. Walks are iterative and bounded, so a deep or wide tree
costs neither a `RecursionError` nor unbounded time.
"""

import contextlib
import os
import shutil
import stat

# Bounds on the output tree walked (a submission is a file or a few).
MAX_OUTPUT_ENTRIES = 4096
MAX_OUTPUT_DEPTH = 32
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class InputError(ValueError):
    """An input dir holds what no sandbox may copy or mount; names the entry."""


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def input_files(input_dir: str | os.PathLike) -> list[tuple[str, str]]:
    """The regular files under `input_dir`, as (relative path, real path) pairs, sorted.

    `input_dir` itself may be a link (task views link their `public/`); below
    it, a link counts as the regular file it resolves to when that file lies
    inside the directory.

    Raises:
        InputError: an entry is a link that leaves `input_dir`, dangles or
            points to a directory, or is neither a file nor a directory.
    """
    root = os.path.realpath(os.fspath(input_dir))
    found, stack = [], [""]
    while stack:
        rel_dir = stack.pop()
        with os.scandir(os.path.join(root, rel_dir)) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                rel = os.path.join(rel_dir, entry.name)
                mode = entry.stat(follow_symlinks=False).st_mode
                if stat.S_ISDIR(mode):
                    stack.append(rel)
                elif stat.S_ISREG(mode):
                    found.append((rel, entry.path))
                elif stat.S_ISLNK(mode):
                    target = os.path.realpath(entry.path)
                    if not _inside(target, root):
                        raise InputError(
                            f"input entry {rel!r} links outside the input dir (to {target!r}); "
                            "a sandbox never follows such links: copy the file in instead"
                        )
                    if not os.path.isfile(target) or os.path.islink(target):
                        raise InputError(
                            f"input entry {rel!r} links to {target!r}, which is not a regular "
                            "file; only links to files inside the input dir are allowed"
                        )
                    found.append((rel, target))
                else:
                    raise InputError(f"input entry {rel!r} is not a regular file nor a directory")
    return sorted(found)


def copy_input(input_dir: str | os.PathLike, target: str, *, file_mode: int, dir_mode: int) -> None:
    """Copies the files of `input_dir` (see `input_files`) as plain files into `target`.

    Directories get `dir_mode` (set bottom-up, after their contents) and files
    `file_mode`; links inside become copies of the files they name.

    Raises:
        InputError: as `input_files`; nothing is copied then.
    """
    entries = input_files(input_dir)
    dirs = {target}
    os.mkdir(target, 0o700)
    for rel, real in entries:
        path = os.path.join(target, rel)
        parent = os.path.dirname(path)
        if parent not in dirs:
            os.makedirs(parent, 0o700, exist_ok=True)
            while parent not in dirs:
                dirs.add(parent)
                parent = os.path.dirname(parent)
        shutil.copyfile(real, path, follow_symlinks=True)
        os.chmod(path, file_mode)
    # Empty directories of the input are kept too, like a copy of the tree.
    root = os.path.realpath(os.fspath(input_dir))
    for dirpath, dirnames, _ in os.walk(root):
        for name in dirnames:
            path = os.path.join(target, os.path.relpath(os.path.join(dirpath, name), root))
            if path not in dirs and not os.path.islink(os.path.join(dirpath, name)):
                os.makedirs(path, 0o700, exist_ok=True)
                dirs.add(path)
    for path in sorted(dirs, key=len, reverse=True):
        os.chmod(path, dir_mode)


def _open_dir(parent_fd: int, name: str) -> int | None:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError:  # a link (ELOOP), not a directory, or gone
        return None


def _read_file(dir_fd: int, name: str, budget: int, owner: int | None) -> bytes | str:
    """The content of regular file `name` in `dir_fd`, or why it is left out."""
    try:
        before = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return "unreadable"
    if stat.S_ISLNK(before.st_mode):
        return "link"
    if not stat.S_ISREG(before.st_mode):  # never opened: a FIFO or device could block or act
        return "not a regular file"
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError:
        return "link or unreadable"
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) != (before.st_dev, before.st_ino):
            return "replaced while read"
        if not stat.S_ISREG(info.st_mode):
            return "not a regular file"
        # A second name for a file means a hard link, possibly to a file the
        # program may not read; so does another owner than the program's uid.
        if info.st_nlink != 1 or (owner is not None and info.st_uid != owner):
            return "hard link or not the program's file"
        if info.st_size > budget:
            return "over the output cap"
        data = f.read(budget + 1)
        return data if len(data) <= budget else "over the output cap"


def read_output(
    work_fd: int, name: str, max_bytes: int, *, owner: int | None = None
) -> tuple[dict[str, bytes], list[str]]:
    """Regular files of directory `name` in the directory `work_fd`, never following links.

    Args:
        work_fd: a directory file descriptor of the work dir (opened by the sandbox).
        name: the output directory's name in it.
        max_bytes: total bytes returned; larger files are left out.
        owner: when given, files owned by another uid are left out.

    Returns:
        (files, dropped): relative path -> content, and what was left out and why.
    """
    files, dropped, budget = {}, [], max_bytes
    top = _open_dir(work_fd, name)
    if top is None:
        with contextlib.suppress(OSError):  # absent: nothing to say
            os.stat(name, dir_fd=work_fd, follow_symlinks=False)
            dropped.append(f"{name}/ (a link or not a directory)")
        return files, dropped
    seen = 0
    stack = [(top, "", 0)]
    try:
        while stack:
            dir_fd, rel_dir, depth = stack.pop()
            try:
                names = sorted(os.listdir(dir_fd))
                subdirs = []
                for entry in names:
                    rel = os.path.join(rel_dir, entry)
                    seen += 1
                    if seen > MAX_OUTPUT_ENTRIES:
                        dropped.append(f"entries past the first {MAX_OUTPUT_ENTRIES}")
                        stack.clear()
                        break
                    with contextlib.suppress(OSError):
                        if stat.S_ISDIR(
                            os.stat(entry, dir_fd=dir_fd, follow_symlinks=False).st_mode
                        ):
                            subdirs.append((entry, rel))
                            continue
                    content = _read_file(dir_fd, entry, budget, owner)
                    if isinstance(content, str):
                        dropped.append(f"{rel} ({content})")
                    else:
                        files[rel] = content
                        budget -= len(content)
                for entry, rel in reversed(subdirs):
                    if depth + 1 > MAX_OUTPUT_DEPTH:
                        dropped.append(f"{rel}/ (deeper than {MAX_OUTPUT_DEPTH} levels)")
                    elif (child := _open_dir(dir_fd, entry)) is None:
                        dropped.append(f"{rel}/ (link or unreadable)")
                    else:
                        stack.append((child, rel, depth + 1))
            finally:
                os.close(dir_fd)
    finally:
        for dir_fd, _, _ in stack:
            os.close(dir_fd)
    return files, dropped


def remove_tree(path: str) -> None:
    """Removes the tree at `path` however deep, restoring write access on the way.

    Each directory met is first renamed into the top one, so that no path
    grows long and no walk recurses: a program may nest directories deeper
    than the recursion limit or `PATH_MAX`. Never follows links and never
    raises: what cannot be removed stays.
    """
    with contextlib.suppress(OSError):
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            os.unlink(path)
            return
        os.chmod(path, 0o700)
    try:
        top = os.open(path, _DIR_FLAGS)
    except OSError:
        return
    pending: list[str | None] = [None]  # names in `top` of directories to empty; None: `top`
    lifted = 0
    try:
        while pending:
            name = pending.pop()
            fd = top if name is None else _open_dir(top, name)
            if fd is None:
                continue
            try:
                for entry in os.listdir(fd):
                    with contextlib.suppress(OSError):
                        if not stat.S_ISDIR(
                            os.stat(entry, dir_fd=fd, follow_symlinks=False).st_mode
                        ):
                            os.unlink(entry, dir_fd=fd)
                            continue
                        # Checked above not to be a link; the program is no longer running.
                        os.chmod(entry, 0o700, dir_fd=fd)
                        lifted += 1
                        flat = f".wmrl-remove-{lifted}"
                        os.rename(entry, flat, src_dir_fd=fd, dst_dir_fd=top)
                        pending.append(flat)
            finally:
                if fd != top:
                    os.close(fd)
            if name is not None:
                with contextlib.suppress(OSError):
                    os.rmdir(name, dir_fd=top)
    finally:
        os.close(top)
    with contextlib.suppress(OSError):
        os.rmdir(path)
