"""RayExecutor on a real two-node Ray cluster started by the test on loopback.

The head and the worker are `ray start --block` processes on 127.0.0.2
(`LocalRayCluster`: Ray rewrites 127.0.0.1 into the machine's outward address;
any other loopback address is kept). The killed-worker test SIGKILLs the
worker node's whole process tree (raylet, its actor) while programs run on it;
the killed-actor test only the actor's (the node lives on). Skipped without
Ray unless WMRL_REQUIRE_RAY is set (as in CI).
"""

import functools
import os
import time

import pytest

if os.environ.get("WMRL_REQUIRE_RAY"):  # CI: a missing extra is a failure, not a skip
    import ray
else:
    ray = pytest.importorskip("ray", reason='needs the ray extra: pip install -e ".[ray]"')

from tests.sandbox.conftest import TEST_LIMITS  # noqa: E402
from wmrl_jax.sandbox import DockerExecutor, InfraError  # noqa: E402
from wmrl_jax.sandbox.pool import input_digest  # noqa: E402
from wmrl_jax.sandbox.ray_executor import (  # noqa: E402
    NodeSandbox,
    RayExecutor,
    local_executor_factory,
    pack_dir,
)
from wmrl_jax.sandbox.ray_local import LocalRayCluster, kill_tree  # noqa: E402


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A head and a worker node (1 CPU each) on loopback; this process is the driver."""
    with LocalRayCluster(workers=1, log_dir=str(tmp_path_factory.mktemp("ray"))) as c:
        yield c


def ensure_worker(cluster) -> None:
    """The worker node runs (a test that killed it does not decide the next one's)."""
    if not cluster.worker_running(len(cluster.workers) - 1):
        cluster.add_worker()


def test_docker_nodes_run_each_program_once_and_unpack_inputs_once_per_node(
    cluster, docker_available, tmp_path
):
    data = tmp_path / "data"
    data.mkdir()
    (data / "numbers.txt").write_text("1 2 3 4\n")
    make = functools.partial(DockerExecutor, docker_available, limits=TEST_LIMITS, timeout_s=60)
    source = (
        "import os, time\n"
        "time.sleep(0.5)\n"
        "n = sum(map(int, open('input/numbers.txt').read().split()))\n"
        "print(os.environ['WMRL_TAG'] if 'WMRL_TAG' in os.environ else n, {i})\n"
    )
    ensure_worker(cluster)
    with RayExecutor(slots_per_node=2, make_executor=make) as ex:
        assert ex.environment.startswith(f"ray:docker:{docker_available}@")
        assert len(ex.live_workers) == 2
        futures = [ex.submit(source.format(i=i), input_dir=data) for i in range(6)]
        results = [f.result(timeout=120) for f in futures]
        assert [r.status for r in results] == ["ok"] * 6, [r.stderr for r in results]
        assert [r.stdout for r in results] == [f"10 {i}\n" for i in range(6)]
        assert sorted(ex.per_worker) == sorted(cluster.alive_nodes())  # both nodes ran programs
        assert sum(ex.per_worker.values()) == 6
        stats = ex.node_stats()
        assert [s["inputs_unpacked"] for s in stats.values()] == [1, 1]
        assert sum(s["runs"] for s in stats.values()) == 6
        assert ex.stats["submitted"] == ex.stats["results"] == 6 and ex.stats["lost"] == 0


def test_node_resource_selects_the_nodes_that_get_sandboxes(cluster):
    ensure_worker(cluster)
    make = local_executor_factory(limits=TEST_LIMITS, timeout_s=60)
    head = cluster.head_node()
    with RayExecutor(
        slots_per_node=1, make_executor=make, node_resource="node:__internal_head__"
    ) as ex:
        assert ex.live_workers == [head]
        assert ex.run("print(6 * 7)").stdout == "42\n"
    with pytest.raises(InfraError, match="resource 'sandbox'"):
        RayExecutor(make_executor=make, node_resource="sandbox")


def wait_busy(ex, node, slots) -> None:
    """Until `slots` programs run on `node` (a deadline only against a hang)."""
    deadline = time.monotonic() + 60
    while ex.busy.get(node, 0) < slots:
        assert time.monotonic() < deadline, ex.busy
        time.sleep(0.05)


def test_a_program_whose_actor_dies_mid_run_is_not_run_again(cluster):
    make = local_executor_factory(limits=TEST_LIMITS, timeout_s=60)
    ensure_worker(cluster)
    with RayExecutor(slots_per_node=1, make_executor=make) as ex:
        head = cluster.head_node()
        (other,) = [n for n in ex.live_workers if n != head]
        # One program per node; the one on the other node loses its actor (the
        # actor's process and the program under it, SIGKILL), the node lives on.
        futures = [ex.submit(f"import time\ntime.sleep(8)\nprint({i})\n") for i in range(2)]
        wait_busy(ex, other, 1)
        pid = ray.get(ex.workers[other].actor.describe.remote(), timeout=30)["pid"]
        kill_tree(pid)
        results = [f.result(timeout=120) for f in futures]
        (lost,) = [r for r in results if not r.ok]
        assert lost.status == "infra_error" and "\n" not in lost.message
        assert f"worker {other} lost while the program ran (not run again" in lost.message
        # The head ran its own program and nothing else: the lost one was not rerun.
        assert [r.status for r in results].count("ok") == 1
        assert ex.node_stats()[head]["runs"] == 1
        assert ex.stats["lost"] == 1 and ex.stats["retries"] == 0, ex.stats
        assert ex.stats["submitted"] == ex.stats["results"] == 2
        assert ex.live_workers == [head]


def test_node_actor_closes_its_executor_on_graceful_exit(cluster, tmp_path):
    (tmp_path / "x.txt").write_text("7\n")
    actor_cls = ray.remote(NodeSandbox).options(num_cpus=0)
    actor = actor_cls.remote(local_executor_factory(limits=TEST_LIMITS, timeout_s=60))
    box = [ray.put(pack_dir(tmp_path))]
    source = "print(open('input/x.txt').read().strip())"
    result = ray.get(actor.run.remote(source, input_digest(tmp_path), box, 60, None), timeout=120)
    assert result.stdout == "7\n", result
    root = ray.get(actor.describe.remote(), timeout=30)["inputs_root"]
    assert os.listdir(root)  # the node's input cache holds the unpacked dir
    actor.__ray_terminate__.remote()  # a graceful exit, as when its handles are dropped
    deadline = time.monotonic() + 60  # only against a hang
    while os.path.exists(root):
        assert time.monotonic() < deadline, f"{root} outlived its actor"
        time.sleep(0.2)


def test_killed_worker_mid_batch_reruns_its_programs_on_the_head_when_asked(cluster):
    make = local_executor_factory(limits=TEST_LIMITS, timeout_s=60)
    ensure_worker(cluster)
    with RayExecutor(slots_per_node=2, make_executor=make, max_retries=2, rerun_lost=True) as ex:
        head = cluster.head_node()
        (other,) = [n for n in ex.live_workers if n != head]
        futures = [ex.submit(f"import time\ntime.sleep(2.0)\nprint({i})\n") for i in range(6)]
        wait_busy(ex, other, 2)  # both of the worker's slots hold a program
        cluster.kill_worker(len(cluster.workers) - 1)
        results = [f.result(timeout=120) for f in futures]
        assert [r.status for r in results] == ["ok"] * 6, [r.message for r in results]
        assert sorted(r.stdout for r in results) == [f"{i}\n" for i in range(6)]
        # The two programs lost with the node ran again, on the head; nothing
        # counted twice: one result per submission, the lost attempts apart.
        assert ex.stats["lost"] == 2 and ex.stats["retries"] == 2, ex.stats
        assert ex.stats["submitted"] == ex.stats["results"] == 6
        assert dict(ex.per_worker) == {head: 6}
        assert ex.live_workers == [head]
