"""EnginePool over two real Docker engines on different sockets.

The first engine is the tests' usual one; the second is a dockerd of its own
(data root, exec root, pid file and unix socket under one state dir, no
bridge, no iptables) started here, with the sandbox image copied into it by
`docker save | docker load` (once: the state dir outlives the test run). The
fault test SIGKILLs the second engine mid-batch.
"""

import os
import signal
import subprocess
import tempfile
import time

import pytest

from tests.sandbox.conftest import TEST_LIMITS
from tests.sandbox.engines import ExtraEngine, running, socket_url
from wmrl_jax.sandbox.docker_backend import LABEL
from wmrl_jax.sandbox.fanout import DEADLINE_MESSAGE
from wmrl_jax.sandbox.remote import EnginePool

STATE = os.path.join(tempfile.gettempdir(), "wmrl-dockerd-second")
URL_B = socket_url(STATE)


class SecondEngine(ExtraEngine):
    """The second engine; `kill` takes it down as a lost machine."""

    def __init__(self):
        super().__init__(STATE)

    def start(self) -> None:
        super().start()
        # Containers a killed run left behind (records only: their processes died with it).
        for container in self.client().containers.list(all=True, filters={"label": LABEL}):
            container.remove(force=True)

    def kill(self) -> None:
        """SIGKILLs the engine and its containers' shims: the machine is gone."""
        os.kill(self.pid(), signal.SIGKILL)  # its containerd follows (parent-death signal)
        if self.proc is not None:
            self.proc.wait(30)
        marker = f"-address {STATE}/".encode()
        for name in os.listdir("/proc"):
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if name.isdigit() and marker in f.read().replace(b"\0", b" "):
                        os.kill(int(name), signal.SIGKILL)
            except OSError:
                continue
        # dockerd bind-mounts its data root onto itself and unmounts it on a clean stop only.
        subprocess.run(["umount", "--lazy", f"{STATE}/data"], check=False, capture_output=True)


@pytest.fixture(scope="module")
def second_engine(docker_image):
    """The second engine, answering, with the sandbox image; stopped afterwards."""
    with running(SecondEngine(), docker_image) as engine:
        yield engine


def _first_url() -> str:
    return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")


def _program(i: int, seconds: float) -> str:
    return f"import time\ntime.sleep({seconds})\nprint({i})\n"


def test_two_engines_share_the_work_within_their_slots(second_engine, docker_available):
    urls = [_first_url(), URL_B]
    with EnginePool(urls, docker_available, slots=[1, 2], limits=TEST_LIMITS, timeout_s=60) as pool:
        assert pool.environment.startswith(f"docker:{docker_available}@")
        futures = [pool.submit(_program(i, 0.5)) for i in range(6)]
        peak = dict.fromkeys(urls, 0)
        while not all(f.done() for f in futures):
            for url, n in pool.busy.items():
                peak[url] = max(peak[url], n)
            time.sleep(0.01)
        results = [f.result() for f in futures]
    assert [r.status for r in results] == ["ok"] * 6, [r.stderr for r in results]
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(6)]
    assert sorted(pool.per_worker) == sorted(urls) and sum(pool.per_worker.values()) == 6
    assert peak[urls[0]] <= 1 and peak[URL_B] <= 2, peak  # back-pressure: never over the slots
    assert pool.stats["submitted"] == pool.stats["results"] == 6
    assert pool.stats["lost"] == 0, list(pool.lost_reasons)


def test_engine_killed_mid_batch_reruns_elsewhere_and_comes_back(second_engine, docker_available):
    urls = [_first_url(), URL_B]
    with EnginePool(urls, docker_available, slots=2, limits=TEST_LIMITS, timeout_s=60) as pool:
        futures = [pool.submit(_program(i, 2.0)) for i in range(6)]
        deadline = time.monotonic() + 60
        while pool.busy[URL_B] < 2:
            assert time.monotonic() < deadline, pool.busy
            time.sleep(0.02)
        time.sleep(0.5)  # both programs on the second engine are running
        second_engine.kill()
        results = [f.result(timeout=120) for f in futures]
        assert [r.status for r in results] == ["ok"] * 6, [r.message for r in results]
        assert sorted(r.stdout for r in results) == [f"{i}\n" for i in range(6)]
        assert pool.stats["lost"] == 2 and pool.stats["retries"] == 2, pool.stats
        assert pool.stats["submitted"] == pool.stats["results"] == 6
        assert dict(pool.per_worker) == {urls[0]: 6}
        assert pool.live_workers == [urls[0]]

        second_engine.start()  # back: `refresh` probes it and gives it work again
        pool.refresh()
        assert sorted(pool.live_workers) == sorted(urls)
        futures = [pool.submit(_program(10 + i, 0.5)) for i in range(4)]
        assert [f.result(timeout=120).status for f in futures] == ["ok"] * 4
        assert pool.per_worker[URL_B] >= 1


def test_a_program_past_the_deadline_is_dropped_without_holding_up_the_others(docker_available):
    with EnginePool(
        [_first_url()], docker_available, slots=2, limits=TEST_LIMITS, deadline_s=3.0
    ) as pool:
        start = time.monotonic()
        slow = pool.submit(_program(0, 30.0), timeout_s=8)
        fast = pool.submit(_program(1, 0.1))
        assert fast.result(timeout=60).stdout == "1\n"
        result = slow.result(timeout=60)
        waited = time.monotonic() - start
    assert result.status == "infra_error" and result.message.startswith(DEADLINE_MESSAGE)
    assert waited < 8  # dropped at its deadline, not at its own timeout
    # Closing waited for the container; its late answer was discarded, counted once.
    assert pool.stats["dropped"] == 1 and pool.stats["late"] == 1
    assert pool.stats["submitted"] == pool.stats["results"] == 2
