"""RayExecutor: programs fanned out over the nodes of a Ray cluster.

One actor per alive node owns that node's executor (a `DockerExecutor` with
the image checked when the actor starts, or whatever `make_executor` builds)
and runs up to `slots_per_node` programs at once (a threaded actor). The
driver queues programs and hands each to a node with a free slot
(`FanOut`), so a busy cluster applies back-pressure instead of piling work
onto nodes; results stream back as they finish.

Inputs travel by content: an input dir is packed once per content digest
(`input_digest`) into the object store, and each node's actor unpacks it
once into its own cache and mounts that copy for every program that needs
it (`NodeSandbox.stats()["inputs_unpacked"]`).

A node that dies mid-batch (its raylet or the actor's process killed) turns
its running programs into "infra_error" results that name the node; they are
not run again elsewhere, since a program may have run (and its container may
still run) on a node whose actor is gone, unless `rerun_lost=True` says so
(see `FanOut`). Programs still queued run on the other nodes; `refresh`
starts actors on nodes that joined since. An actor that exits gracefully
(its handles dropped, the driver gone) closes its executor first.

Needs the `ray` extra (`pip install -e ".[ray]"`). Connects to a running
cluster (`address`, or the driver's `ray.init`), never starts one; an address
where nothing listens fails after `connect_timeout_s`. Authentication is
Ray's own: the driver uses the token of its environment (`RAY_AUTH_MODE=token`
with `RAY_AUTH_TOKEN`, `RAY_AUTH_TOKEN_PATH` or `~/.ray/auth_token`), and
the nodes' actors inherit their raylet's.

Example:
    >>> with RayExecutor(address="auto", slots_per_node=4) as ex:  # doctest: +SKIP
    ...     futures = [ex.submit(src, input_dir="data/") for src in sources]
    ...     results = [f.result() for f in concurrent.futures.as_completed(futures)]
"""

import concurrent.futures
import functools
import io
import logging
import os
import shutil
import socket
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable

from wmrl_jax.sandbox.fanout import FanOut, WorkerLost
from wmrl_jax.sandbox.files import input_files
from wmrl_jax.sandbox.pool import input_digest
from wmrl_jax.sandbox.result import ExecutionResult, Executor, InfraError, check_input_dir

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0


def bootstrap_address(address: str | None) -> str | None:
    """The "host:port" that `ray.init(address)` connects to (None: Ray finds none itself).

    "auto" and None read `RAY_ADDRESS`, else the last cluster `ray start` wrote
    down on this machine, as `ray.init` does; "ray://host:port" is the client port.
    """
    if address and address.startswith("ray://"):
        return address.removeprefix("ray://")
    try:
        from ray._private.services import canonicalize_bootstrap_address

        return canonicalize_bootstrap_address(address or "auto")
    except Exception:  # no cluster found, or a Ray without it: `ray.init` says why
        return None


def wait_listening(address: str, timeout_s: float) -> None:
    """Returns once something accepts TCP connections at "host:port".

    Ray's own connect retries a refusing address for minutes (20 attempts of
    about 40 s each); this check fails in `timeout_s` instead.

    Raises:
        InfraError: nothing accepted a connection within `timeout_s` seconds.
    """
    host, _, port = address.rpartition(":")
    try:
        target = (host.strip("[]"), int(port))
    except ValueError:  # not host:port: left to `ray.init`
        return
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection(target, timeout=min(max(left, 0.1), 5.0)):
                return
        except OSError as e:
            if time.monotonic() + 0.5 > deadline:
                why = e.strerror or type(e).__name__
                raise InfraError(
                    f"no Ray cluster answers at {address}: {why} for {timeout_s:g} s"
                    " (start one with `ray start --head`, or point RAY_ADDRESS at one)"
                ) from None
            time.sleep(0.5)


def default_executor_factory() -> Executor:
    """`make_executor()` on the node: Docker when there, else the local backend."""
    from wmrl_jax.sandbox import make_executor

    return make_executor()


def pack_dir(root: str | os.PathLike) -> bytes:
    """An uncompressed tar of the input files under `root`, links copied as plain files.

    The same rules as every executor's input (`sandbox.files.input_files`): a link
    must resolve to a regular file inside `root`; anything else raises `InputError`.
    """
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", dereference=True) as tar:
        for rel, real in input_files(root):
            tar.add(real, arcname=rel, recursive=False)
    return buf.getvalue()


def _auth_refused(error: BaseException | None) -> bool:
    """Whether a failed `ray.init` was the cluster refusing the driver's token.

    Ray wraps its `AuthenticationError` in a ConnectionError whose cause holds
    the original's traceback as text.
    """
    while error is not None:
        text = f"{type(error).__name__}: {error}"
        if "AuthenticationError" in text or "InvalidAuthToken" in text:
            return True
        error = error.__cause__ or error.__context__
    return False


class NodeSandbox:
    """The per-node actor: an executor and a cache of unpacked inputs by digest.

    Args:
        make_executor: builds the executor on the node (called once, here).
    """

    def __init__(self, make_executor: Callable[[], Executor]):
        self.executor = make_executor()
        self._closed = False
        self._root = tempfile.mkdtemp(prefix="wmrl-ray-inputs-")
        self._inputs: dict[str, str] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self._stats = {"runs": 0, "inputs_unpacked": 0}

    def describe(self) -> dict:
        """The node id, the pid, the executor's environment and the input cache's dir."""
        import ray

        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "environment": self.executor.environment,
            "inputs_root": self._root,
        }

    def stats(self) -> dict:
        with self._lock:
            return dict(self._stats)

    def _input_dir(self, digest: str, box: list) -> str:
        import ray

        with self._lock:
            lock = self._locks.setdefault(digest, threading.Lock())
        with lock:  # one unpack per digest, however many programs wait for it
            if digest not in self._inputs:
                target = os.path.join(self._root, digest)
                staging = target + ".tmp"
                shutil.rmtree(staging, ignore_errors=True)
                with tarfile.open(fileobj=io.BytesIO(ray.get(box[0])), mode="r") as tar:
                    tar.extractall(staging, filter="data")
                os.chmod(staging, 0o755)
                os.replace(staging, target)
                self._inputs[digest] = target
                with self._lock:
                    self._stats["inputs_unpacked"] += 1
            return self._inputs[digest]

    def run(self, source, digest, box, timeout_s, files) -> ExecutionResult:
        """Runs one program on this node's executor (inputs from the cache)."""
        with self._lock:
            self._stats["runs"] += 1
        input_dir = None if digest is None else self._input_dir(digest, box)
        return self.executor.run(source, input_dir=input_dir, timeout_s=timeout_s, files=files)

    def close(self) -> None:
        """Closes the executor and removes the input cache (once; later calls do nothing)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self.executor.close()
        finally:
            shutil.rmtree(self._root, ignore_errors=True)

    def __ray_shutdown__(self) -> None:
        # Ray calls this when the actor exits gracefully (its handles dropped,
        # `__ray_terminate__`, the driver gone), after its running calls end.
        self.close()


class _NodeWorker:
    """A `fanout.Worker` over one node's actor."""

    def __init__(self, node_id: str, actor, slots: int, ship: Callable):
        self.name, self.actor, self.slots, self._ship = node_id, actor, slots, ship

    def start(self, source, *, input_dir, timeout_s, files):
        digest, box = self._ship(input_dir)
        ref = self.actor.run.remote(source, digest, box, timeout_s, files)
        out: concurrent.futures.Future = concurrent.futures.Future()

        def done(f):
            import ray

            try:
                out.set_result(f.result())
            except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as e:
                why = " ".join(str(e).split())[:300]  # Ray's text spans lines
                out.set_exception(WorkerLost(f"{type(e).__name__}: {why}"))
            except Exception as e:
                out.set_exception(e)

        ref.future().add_done_callback(done)
        return out

    def alive(self) -> bool:
        import ray

        try:
            ray.get(self.actor.describe.remote(), timeout=10)
            return True
        except Exception:
            return False

    def close(self) -> None:
        import ray

        try:
            ray.get(self.actor.close.remote(), timeout=60)
        except Exception as e:
            log.warning("node %s: %s", self.name[:12], e)
        ray.kill(self.actor)


class RayExecutor(FanOut):
    """An `Executor` over a Ray cluster's nodes; see the module docstring.

    Args:
        address: the cluster to connect to when this process has not called
            `ray.init` yet (e.g. "127.0.0.2:6379"); None: `RAY_ADDRESS`, else
            a cluster started on this machine (`ray start`).
        slots_per_node: programs each node runs at once.
        make_executor: picklable zero-argument callable building a node's
            executor (e.g. `functools.partial(DockerExecutor, image, limits=...)`).
        max_nodes: use at most this many nodes (None: all alive).
        node_resource: use only nodes that declare this custom resource (e.g.
            "sandbox", from `ray start --resources='{"sandbox": 1}'`), so that a
            trainer host joined to the cluster gets no sandbox; None: every node.
        actor_options: extra `ray.remote` options of the node actors (e.g. a
            custom resource that marks sandbox nodes); default `num_cpus=0`,
            the programs' limits are the executor's business.
        connect_timeout_s: how long to wait for the cluster's address to accept
            a connection before giving up (only when this call connects).
        rerun_lost: run a program again on another node when its node's actor
            died while it ran (up to `max_retries`). Off by default: the program
            may already have run there, in part or in whole (a container of a
            dead actor runs on until its own timeout), so its result is an
            "infra_error" naming the node instead.
        **fanout_kwargs: `max_retries` (for "infra_error" results the nodes
            return), `deadline_s`, `refresh_interval_s` (`FanOut`).

    Raises:
        InfraError: Ray is not installed, no cluster answers (within
            `connect_timeout_s`, or it refuses this driver's authentication),
            or no node could start an executor.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        slots_per_node: int = 4,
        make_executor: Callable[[], Executor] = default_executor_factory,
        max_nodes: int | None = None,
        node_resource: str | None = None,
        actor_options: dict | None = None,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        rerun_lost: bool = False,
        **fanout_kwargs,
    ):
        try:
            import ray
        except ImportError as e:
            raise InfraError('RayExecutor needs Ray: pip install -e ".[ray]"') from e
        if slots_per_node < 1:
            raise ValueError(f"slots_per_node must be >= 1, got {slots_per_node}")
        if not connect_timeout_s > 0:
            raise ValueError(f"connect_timeout_s must be > 0, got {connect_timeout_s}")
        if not ray.is_initialized():
            target = bootstrap_address(address)
            if target is not None:
                wait_listening(target, connect_timeout_s)
            try:
                # "auto": RAY_ADDRESS or a cluster on this machine; never a new one.
                ray.init(address=address or "auto", log_to_driver=False, configure_logging=False)
            except Exception as e:
                where = target or address or "auto"
                if _auth_refused(e):
                    raise InfraError(
                        f"the Ray cluster at {where} refused this driver's authentication:"
                        " give the driver RAY_AUTH_MODE=token and the cluster's token"
                        " (RAY_AUTH_TOKEN, or RAY_AUTH_TOKEN_PATH naming its file)"
                    ) from e
                why = " ".join(str(e).split())[:300]
                raise InfraError(f"no Ray cluster answers at {where}: {why}") from e
        self.slots_per_node = slots_per_node
        self.max_nodes = max_nodes
        self.node_resource = node_resource
        self._make_executor = make_executor
        self._actor_options = {
            # A thread beyond the slots: `describe` (the liveness probe), `stats`
            # and `close` answer while every slot runs a program.
            "max_concurrency": slots_per_node + 1,
            "max_restarts": 0,
            "num_cpus": 0,
            **(actor_options or {}),
        }
        self._actor_cls = ray.remote(NodeSandbox)
        self._shipped: dict[str, list] = {}
        self._ship_lock = threading.Lock()
        workers = self._start_actors(set())
        if not workers:
            wanted = f" with resource {node_resource!r}" if node_resource else ""
            raise InfraError(f"no Ray node{wanted} could start a sandbox executor")
        environments = {env for _, env in workers}
        if len(environments) > 1:
            raise InfraError(f"nodes run programs on different environments: {environments}")
        super().__init__(
            [w for w, _ in workers],
            environment=f"ray:{environments.pop()}",
            rerun_lost=rerun_lost,
            **fanout_kwargs,
        )

    def _start_actors(self, known: set[str]) -> list:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = [
            n["NodeID"]
            for n in ray.nodes()
            if n["Alive"]
            and n["NodeID"] not in known
            and (self.node_resource is None or n["Resources"].get(self.node_resource, 0) > 0)
        ]
        if self.max_nodes is not None:
            nodes = nodes[: max(self.max_nodes - len(known), 0)]
        actors = {
            node: self._actor_cls.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
                **self._actor_options,
            ).remote(self._make_executor)
            for node in nodes
        }
        workers = []
        for node, actor in actors.items():
            try:  # the executor is built (and its image checked) before any program
                info = ray.get(actor.describe.remote(), timeout=120)
            except Exception as e:
                log.warning("node %s has no sandbox: %s", node[:12], str(e)[:300])
                ray.kill(actor)
                continue
            workers.append(
                (_NodeWorker(node, actor, self.slots_per_node, self._ship), info["environment"])
            )
        return workers

    def discover(self):
        """Actors on nodes that joined (or came back) since the last look."""
        with self._cond:
            known = set(self._workers) - self._dead
        found = []
        for worker, env in self._start_actors(known):
            if f"ray:{env}" == self.environment:
                found.append(worker)
            else:
                log.warning(
                    "node %s runs %s, not %s; left out", worker.name[:12], env, self.environment
                )
                worker.close()
        return found

    def _ship(self, input_dir) -> tuple[str | None, list | None]:
        """(digest, [object ref]) of the packed input dir, put once per content."""
        import ray

        if input_dir is None:
            return None, None
        check_input_dir(input_dir)
        digest = input_digest(input_dir)
        with self._ship_lock:
            if digest not in self._shipped:
                # In a list, so that Ray passes the reference, not the bytes: a node
                # fetches them only when its cache misses.
                self._shipped[digest] = [ray.put(pack_dir(input_dir))]
            return digest, self._shipped[digest]

    def node_stats(self) -> dict[str, dict]:
        """Each live node's actor stats (`runs`, `inputs_unpacked`)."""
        import ray

        out = {}
        for name in self.live_workers:
            try:
                out[name] = ray.get(self._workers[name].actor.stats.remote(), timeout=30)
            except Exception as e:
                log.warning("node %s: %s", name[:12], e)
        return out

    def close(self) -> None:
        super().close()
        self._shipped.clear()


def local_executor_factory(**kwargs) -> Callable[[], Executor]:
    """A picklable factory of `LocalExecutor(**kwargs)` (nodes without Docker)."""
    from wmrl_jax.sandbox.local import LocalExecutor

    return functools.partial(LocalExecutor, **kwargs)
