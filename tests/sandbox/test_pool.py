"""ExecutorPool: width, retries of infrastructure errors only, cache, shutdown, engine loss."""

import os
import tempfile
import threading
import time

import pytest

from tests.sandbox.conftest import TEST_LIMITS, local_executor
from tests.sandbox.engines import ExtraEngine, running
from wmrl_jax.sandbox import DockerExecutor, ExecutionResult, ExecutorPool, input_digest
from wmrl_jax.sandbox.docker_backend import LABEL

STOPPED_STATE = os.path.join(tempfile.gettempdir(), "wmrl-dockerd-stopped")


class FakeExecutor:
    """Answers from a script of statuses; records every call."""

    environment = "fake"

    def __init__(self, statuses, delay_s=0.0):
        self.statuses = list(statuses)
        self.delay_s = delay_s
        self.calls = 0
        self.closed = False
        self._lock = threading.Lock()

    def run(self, source, *, input_dir=None, timeout_s=None, files=None):
        with self._lock:
            self.calls += 1
            status = self.statuses.pop(0) if self.statuses else "ok"
        time.sleep(self.delay_s)
        if status == "raise":
            raise RuntimeError("boom")
        return ExecutionResult(status=status, stdout=source)

    def submit(self, *args, **kwargs):
        raise NotImplementedError

    def close(self):
        self.closed = True


def test_infra_errors_are_retried_program_failures_are_not():
    fake = FakeExecutor(["infra_error", "raise", "ok"])
    with ExecutorPool(fake, width=1, max_retries=2, retry_backoff_s=0.0, cache=False) as pool:
        assert pool.submit("a").result().status == "ok"
        assert fake.calls == 3 and pool.stats["retries"] == 2
        fake.statuses = ["error"]
        assert pool.submit("b").result().status == "error"
        assert fake.calls == 4
        fake.statuses = ["infra_error"] * 5
        result = pool.submit("c").result()
    assert result.status == "infra_error" and fake.calls == 7
    assert fake.closed


def test_cache_answers_identical_runs_once(tmp_path):
    (tmp_path / "x.csv").write_text("1")
    fake = FakeExecutor([], delay_s=0.05)
    with ExecutorPool(fake, width=2, retry_backoff_s=0.0) as pool:
        first = pool.submit("p", input_dir=tmp_path)
        second = pool.submit("p", input_dir=tmp_path)  # in flight: same future
        assert first is second and first.result().status == "ok"
        pool.submit("p", input_dir=tmp_path).result()
        pool.submit("p").result()  # other inputs
        pool.submit("p", files={"h.py": "x"}).result()  # other files
        (tmp_path / "x.csv").write_text("2")
        pool.submit("p", input_dir=tmp_path).result()  # inputs changed
    assert fake.calls == 4 and pool.stats["cache_hits"] == 2


def test_infra_errors_are_not_cached():
    fake = FakeExecutor(["infra_error", "ok"])
    with ExecutorPool(fake, width=1, max_retries=0) as pool:
        assert pool.submit("p").result().status == "infra_error"
        assert pool.submit("p").result().status == "ok"
    assert fake.calls == 2


def test_input_digest_sees_names_and_contents(tmp_path):
    (tmp_path / "a").write_text("1")
    d1 = input_digest(tmp_path)
    (tmp_path / "a").rename(tmp_path / "b")
    assert input_digest(tmp_path) != d1
    assert input_digest(None) == "none"


def running_at_once(intervals) -> int:
    """The most (start, end) intervals that hold one instant (a sweep over their ends)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    most = now = 0
    for _, step in events:  # At a tie an end (-1) sorts first: touching is not overlapping.
        now += step
        most = max(most, now)
    return most


def test_running_at_once_counts_overlaps():
    assert running_at_once([(0, 2), (1, 3), (2.5, 4)]) == 2
    assert running_at_once([(0, 1), (1, 2), (2, 3)]) == 1
    assert running_at_once([(0, 5), (1, 5), (2, 5)]) == 3


def test_width_runs_programs_concurrently_and_never_wider():
    # Each program prints when it started and ended (the machine's clock, shared by
    # every process). From those stamps: the most programs running at one instant.
    # One at a time it would be 1; the pool must run several at once and never more
    # than its width. Nothing bounds the wall clock; the programs' 5-s sleep is what
    # lets them overlap, against a start-up skew between them of up to 3.6 s seen on
    # this 2-core machine at load 20 (which broke "all of them at one instant").
    source = "import time\nstart = time.time()\ntime.sleep(5)\nprint({i}, start, time.time())"
    with ExecutorPool(local_executor(timeout_s=120), width=3, cache=False) as pool:
        results = pool.map([source.format(i=i) for i in range(6)])
    assert [r.status for r in results] == ["ok"] * 6, [r.stderr for r in results]
    stamps = [r.stdout.split() for r in results]
    assert [int(i) for i, _, _ in stamps] == list(range(6))
    most = running_at_once([(float(s), float(e)) for _, s, e in stamps])
    assert 2 <= most <= 3, stamps


def test_close_cancels_pending_and_rejects_new_work():
    fake = FakeExecutor([], delay_s=0.2)
    pool = ExecutorPool(fake, width=1, cache=False)
    futures = [pool.submit(str(i)) for i in range(5)]
    pool.close()
    assert futures[0].result().status == "ok"
    assert any(f.cancelled() for f in futures[1:])
    assert fake.closed
    borrowed = FakeExecutor([])
    ExecutorPool(borrowed, close_executor=False).close()
    assert not borrowed.closed
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit("x")
    with pytest.raises(ValueError):
        ExecutorPool(fake, width=0)


def test_docker_pool_leaves_nothing_behind(docker_executor):
    with ExecutorPool(docker_executor, width=2) as pool:
        results = pool.map([f"print({i})" for i in range(4)])
    assert [r.status for r in results] == ["ok"] * 4


def test_engine_stopped_in_the_middle_of_a_batch(docker_image):
    # The engine stopped here is one of the test's own (its own socket and state dir):
    # stopping the usual engine would break whatever another test worker runs on it.
    with running(ExtraEngine(STOPPED_STATE), docker_image) as engine:

        def executor():
            return DockerExecutor(docker_image, limits=TEST_LIMITS, client=engine.client())

        lost = ExecutorPool(executor(), width=2, max_retries=0, cache=False)
        kept = ExecutorPool(executor(), width=2, max_retries=4, retry_backoff_s=1.0, cache=False)
        sleeper = "import time\ntime.sleep(4)\nprint('done')"
        try:
            try:
                doomed = [lost.submit(sleeper) for _ in range(2)]
                survivors = [kept.submit(sleeper) for _ in range(2)]
                time.sleep(2.0)  # all four are running
                engine.stop()
                assert not engine.answers()
                results = [f.result(timeout=120) for f in doomed]
                assert [r.status for r in results] == ["infra_error"] * 2, results
                assert all("Docker engine" in r.message for r in results)
                assert all("launch/docker_engine.sh start" in r.message for r in results)
            finally:
                engine.start()
            # The retrying pool kept its work and finished it once the engine was back.
            kept_results = [f.result(timeout=120) for f in survivors]
            assert [r.stdout for r in kept_results] == ["done\n"] * 2, kept_results
            assert lost.submit("print('back')").result(timeout=120).status == "ok"
        finally:
            for pool in (lost, kept):
                pool.close()
        for pool in (lost, kept):
            left = pool.executor.client.containers.list(
                all=True, filters={"label": f"{LABEL}={pool.executor.token}"}
            )
            assert not left, left
