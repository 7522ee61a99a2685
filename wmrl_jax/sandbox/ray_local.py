"""A Ray cluster on this machine, on loopback: for tests, benchmarks and trying things out.

    with LocalRayCluster(workers=1) as cluster:   # a head and one worker node
        ex = RayExecutor(slots_per_node=2)        # this process is the driver
        ...
        cluster.kill_worker(0)                    # the node dies: SIGKILL to its processes

Every node is a `ray start --block` process of its own on 127.0.0.2 (Ray turns
127.0.0.1 into the machine's outward address; other loopback addresses are
kept), with usage statistics off. Nothing is left running after `close`: each
node's whole process tree is killed.

Authentication is set, not inherited: every node and the driver get token
authentication with a token of this cluster's own (`RAY_AUTH_MODE=token`,
`RAY_AUTH_TOKEN`), so neither a `~/.ray/auth_token` left by an earlier Ray run
nor the installed Ray's default mode decides whether the driver can join (the
head would switch to such a token while the driver, given an address, would
not). The driver's settings are put back on `close`.
"""

import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time

from wmrl_jax.sandbox.ray_executor import wait_listening
from wmrl_jax.sandbox.result import InfraError

HOST = "127.0.0.2"
START_TIMEOUT_S = 120
#: The variables Ray reads its authentication from (`~/.ray/auth_token` after them).
AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def reload_ray_auth() -> None:
    """Makes this process's Ray read its authentication settings again.

    Ray reads the mode and the token once per process and keeps them; a
    driver that changed them in `os.environ` must ask it to look again.
    """
    try:
        from ray._raylet import AuthenticationTokenLoader, Config
    except ImportError:  # a Ray without token authentication: nothing kept
        return
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def _descendants(pid: int) -> list[int]:
    """`pid` and every process below it, from /proc."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    parent = int(f.read().rpartition(")")[2].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL to `pid` and every process below it (a node or an actor lost at once)."""
    for p in _descendants(pid):
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _kill_tree(proc: subprocess.Popen) -> None:
    kill_tree(proc.pid)
    proc.wait(30)


class LocalRayCluster:
    """A head and `workers` worker nodes on loopback; this process connects as the driver.

    Args:
        workers: worker nodes besides the head.
        num_cpus: CPUs each node declares (programs' own limits are the executor's).
        log_dir: where each node's output goes, created if missing (default: a new
            temporary dir).
    """

    def __init__(self, workers: int = 1, *, num_cpus: int = 1, log_dir: str | None = None):
        import ray

        self._ray = ray
        self.num_cpus = num_cpus
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="wmrl-ray-")
        os.makedirs(self.log_dir, exist_ok=True)
        with socket.socket() as s:
            s.bind((HOST, 0))
            self.port = s.getsockname()[1]
        self.address = f"{HOST}:{self.port}"
        auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
        self.env = {k: v for k, v in os.environ.items() if k not in AUTH_VARS}
        self.env.update(auth, RAY_USAGE_STATS_ENABLED="0")
        # The driver's side too; its own settings come back on `close`.
        self._driver_env = {k: os.environ.get(k) for k in AUTH_VARS}
        os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
        os.environ.update(auth, RAY_USAGE_STATS_ENABLED="0")
        reload_ray_auth()
        self.workers: list[subprocess.Popen | None] = []
        self.head = None
        try:
            self.head = self._start(
                "head", "--head", f"--port={self.port}", "--include-dashboard=false"
            )
            self._connect()
            for _ in range(workers):
                self.add_worker()
        except BaseException:
            self.close()
            raise

    def _start(self, name: str, *args: str) -> subprocess.Popen:
        ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
        with open(os.path.join(self.log_dir, f"{name}.log"), "a") as log:
            return subprocess.Popen(
                [ray_cli, "start", *args, f"--node-ip-address={HOST}"]
                + [f"--num-cpus={self.num_cpus}", "--block"],
                env=self.env,
                start_new_session=True,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def _connect(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        # Ray's own connect waits minutes on a port nobody listens on yet.
        while True:
            if self.head.poll() is not None:
                with open(os.path.join(self.log_dir, "head.log")) as f:
                    raise RuntimeError(f"the head node did not start: {f.read()[-2000:]}")
            try:
                wait_listening(self.address, 1.0)
                break
            except InfraError:
                if time.monotonic() > deadline:
                    raise
        while True:
            try:
                self._ray.init(
                    address=self.address,
                    _node_ip_address=HOST,
                    log_to_driver=False,
                    configure_logging=False,
                )
                return
            except Exception:
                if time.monotonic() > deadline or self.head.poll() is not None:
                    raise
                time.sleep(0.5)

    def alive_nodes(self) -> list[str]:
        return [n["NodeID"] for n in self._ray.nodes() if n["Alive"]]

    def head_node(self) -> str:
        """The head's node id."""
        return next(
            n["NodeID"]
            for n in self._ray.nodes()
            if n["Alive"] and "node:__internal_head__" in n["Resources"]
        )

    def add_worker(self) -> int:
        """Starts one more worker node and waits until it is alive; returns its index."""
        want = len(self.alive_nodes()) + 1
        index = len(self.workers)
        self.workers.append(self._start(f"worker{index}", f"--address={self.address}"))
        deadline = time.monotonic() + START_TIMEOUT_S
        while len(self.alive_nodes()) < want:
            if time.monotonic() > deadline or self.workers[index].poll() is not None:
                with open(os.path.join(self.log_dir, f"worker{index}.log")) as f:
                    raise RuntimeError(f"worker node did not join: {f.read()[-2000:]}")
            time.sleep(0.2)
        return index

    def worker_running(self, index: int) -> bool:
        proc = self.workers[index]
        return proc is not None and proc.poll() is None

    def kill_worker(self, index: int) -> None:
        """SIGKILL to the worker node's raylet and everything it started (a lost machine)."""
        _kill_tree(self.workers[index])
        self.workers[index] = None

    def close(self) -> None:
        """Disconnects the driver, kills every node's processes, restores the driver's auth."""
        self._ray.shutdown()
        for proc in [self.head, *self.workers]:
            if proc is not None:
                _kill_tree(proc)
        for key, value in self._driver_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        reload_ray_auth()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
