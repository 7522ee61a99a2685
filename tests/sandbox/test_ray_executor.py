"""RayExecutor on a real two-node Ray cluster started by the test on loopback.

The head and the worker are `ray start --block` processes on 127.0.0.2
(`LocalRayCluster`: Ray rewrites 127.0.0.1 into the machine's outward address;
any other loopback address is kept). The killed-worker test SIGKILLs the
worker node's whole process tree (raylet, its actor) while programs run on it.
Skipped without Ray unless WMRL_REQUIRE_RAY is set (as in CI).
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
from wmrl_jax.sandbox.ray_executor import RayExecutor, local_executor_factory  # noqa: E402
from wmrl_jax.sandbox.ray_local import LocalRayCluster  # noqa: E402


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


def test_killed_worker_mid_batch_reruns_its_programs_on_the_head(cluster):
    make = local_executor_factory(limits=TEST_LIMITS, timeout_s=60)
    ensure_worker(cluster)
    with RayExecutor(slots_per_node=2, make_executor=make, max_retries=2) as ex:
        head = cluster.head_node()
        (other,) = [n for n in ex.live_workers if n != head]
        futures = [ex.submit(f"import time\ntime.sleep(2.0)\nprint({i})\n") for i in range(6)]
        deadline = time.monotonic() + 60
        while ex.busy.get(other, 0) < 2:  # both of the worker's slots hold a program
            assert time.monotonic() < deadline, ex.busy
            time.sleep(0.05)
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
