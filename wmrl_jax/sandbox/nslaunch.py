"""The local sandbox's launcher: a program in new namespaces, seeing an allowlisted filesystem.

Runs as the program's uid (the caller's, or a slot uid as root) in a fresh
interpreter (`python -I -S -c <this file's source>`), with stdlib only, and:

1. unshares user, mount, pid, ipc, net and uts namespaces (the uid maps to
   itself, so the program's file access is that uid's, nothing more);
2. forks the program's process, pid 1 of the new pid namespace, and hands
   the host a pidfd of it over the socket `spec["fd"]`: killing it kills
   every process of the program at once, setsid() or not. The launcher
   dies with the trainer's thread that started it, the program with the
   launcher (parent-death signals; a program may clear its own, so a new
   executor also kills what a dead trainer left, see `leftovers`);
3. in that process builds a new root on a small tmpfs: read-only binds of
   `spec["binds"]` (system dirs, the interpreter's prefix and
   site-packages), the links of `spec["links"]`, a minimal /dev (null,
   zero, full, random, urandom), a size-capped /dev/shm and /tmp, a fresh
   /proc, and the work dir `spec["work"]` writable at its own path;
   pivots into it and detaches the old root, so that nothing else of the
   host (task trees, caches, other programs' work dirs, /run, sockets)
   exists for the program; brings up loopback in the empty net namespace;
4. sets the rlimits, no_new_privs, and execs `spec["argv"]` in the work dir.

The launcher itself waits outside the pid namespace and exits as the program
did (same code, or the same signal). Any failure before the exec exits 126
with one line `wmrl-sandbox: <reason>` on stderr. The program cannot see,
signal or trace the launcher (another pid namespace).
"""

import ctypes
import fcntl
import json
import os
import platform
import resource
import signal
import socket
import struct
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_REC, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 16384, 1 << 18, 1 << 21, 1 << 24
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "arm64": 41}
DEVICES = ("null", "zero", "full", "random", "urandom")
FAILED = 126

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source, target, fstype, flags, data=None) -> None:
    enc = [None if s is None else os.fsencode(s) for s in (source, target, fstype)]
    data = None if data is None else data.encode()
    _check(_libc.mount(enc[0], enc[1], enc[2], flags, data), f"mount {target}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _locked_flags(path: str) -> int:
    """The flags a remount of a bind of `path` must keep (a user namespace may not clear them)."""
    flag = os.statvfs(path).f_flag
    out = MS_NOSUID | MS_NODEV
    if flag & os.ST_NOEXEC:
        out |= MS_NOEXEC
    if flag & os.ST_NOATIME:
        out |= MS_NOATIME
    elif flag & os.ST_RELATIME:
        out |= MS_RELATIME
    else:
        out |= MS_STRICTATIME
    if flag & os.ST_NODIRATIME:
        out |= MS_NODIRATIME
    return out


def _bind(source: str, target: str, *, writable: bool) -> None:
    if os.path.isdir(source):
        os.makedirs(target, 0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
        with open(target, "a"):
            pass
    _mount(source, target, None, MS_BIND | MS_REC)
    flags = MS_BIND | MS_REMOUNT | _locked_flags(source) | (0 if writable else MS_RDONLY)
    _mount(None, target, None, flags)


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s, 0x8913, ifreq))[1]  # SIOCGIFFLAGS
        fcntl.ioctl(s, 0x8914, struct.pack("16sH22x", b"lo", flags | 1))  # SIOCSIFFLAGS, IFF_UP


def _build_root(spec: dict) -> None:
    """Mounts the program's view under `spec["root"]` and pivots into it."""
    root = spec["root"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    # /tmp first: binds below it (a staged interpreter, the work dir) go on top.
    os.makedirs(root + "/tmp")
    _mount(
        "tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={spec['tmp_bytes']},mode=1777"
    )
    for path in spec["binds"]:
        _bind(path, root + path, writable=False)
    for path, target in spec["links"].items():
        os.makedirs(os.path.dirname(root + path), 0o755, exist_ok=True)
        os.symlink(target, root + path)
    dev = root + "/dev"
    os.makedirs(dev, 0o755)
    _mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=755")
    for name in DEVICES:
        open(os.path.join(dev, name), "w").close()
        _mount(f"/dev/{name}", os.path.join(dev, name), None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0")):
        os.symlink(target, os.path.join(dev, name))
    os.symlink("/proc/self/fd/1", os.path.join(dev, "stdout"))
    os.symlink("/proc/self/fd/2", os.path.join(dev, "stderr"))
    os.makedirs(dev + "/shm")
    _mount(
        "tmpfs", dev + "/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={spec['shm_bytes']},mode=1777"
    )
    _bind(spec["work"], root + spec["work"], writable=True)
    os.makedirs(root + "/proc", 0o555)
    try:
        _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError:
        pass  # a host that masks parts of /proc forbids this; no /proc is stricter still
    number = SYS_PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise OSError(0, f"pivot_root: unknown machine {platform.machine()!r}")
    os.chdir(root)
    # pivot_root(".", "."): the old root is stacked under the new one, then detached.
    _check(_libc.syscall(number, b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")
    _mount(None, "/", None, MS_BIND | MS_REMOUNT | MS_RDONLY | _locked_flags("/"))


def _child(spec: dict) -> None:
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
    host = b"sandbox"
    _check(_libc.sethostname(host, len(host)), "sethostname")
    _build_root(spec)
    _loopback_up()
    for name, value in spec["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (value, value))
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    os.chdir(spec["work"])
    os.execv(spec["argv"][0], spec["argv"])


def main(spec: dict) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # Dies with the thread that started it (a killed trainer); its program then too.
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
    if os.getppid() != spec["parent"]:  # that thread was gone before the prctl
        os._exit(FAILED)
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWNET
    try:
        _check(_libc.unshare(flags | CLONE_NEWUTS), "unshare")
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    except OSError as e:
        print(f"wmrl-sandbox: {e}", file=sys.stderr)
        os._exit(FAILED)
    channel = socket.socket(fileno=spec["fd"])
    pid = os.fork()
    if pid == 0:
        try:
            channel.close()
            _child(spec)
        except BaseException as e:  # noqa: BLE001 - any failure is the launcher's, said in one line
            os.write(2, f"wmrl-sandbox: {e}\n".encode(errors="replace"))
        os._exit(FAILED)
    pidfd = os.pidfd_open(pid)
    socket.send_fds(channel, [b"p"], [pidfd])
    os.close(pidfd)
    channel.close()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
