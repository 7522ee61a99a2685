"""FanOut's scheduling rules with scripted workers, and EnginePool's input checks.

The workers here answer after a scripted delay with a scripted status, so that
deadlines, retries and dead workers can be hand-checked in a fraction of a
second; the real backends (a Ray cluster, two Docker engines) are exercised in
test_ray_executor.py and test_remote_engines.py.
"""

import concurrent.futures
import threading
import time

import pytest

from wmrl_jax.sandbox.fanout import DEADLINE_MESSAGE, FanOut, WorkerLost
from wmrl_jax.sandbox.remote import EnginePool, engines_from_env
from wmrl_jax.sandbox.result import ExecutionResult, InfraError


class ScriptedWorker:
    """Answers each program after `delay` s with `status` (or dies: WorkerLost)."""

    def __init__(self, name, slots=1, *, delay=0.0, status="ok", up=True, dies=False):
        self.name, self.slots, self.delay, self.status = name, slots, delay, status
        self.up, self.dies, self.started = up, dies, []

    def start(self, source, *, input_dir, timeout_s, files):
        self.started.append(source)
        future = concurrent.futures.Future()

        def answer():
            time.sleep(self.delay)
            if self.dies:
                self.up = False
                future.set_exception(WorkerLost("node gone"))
            else:
                future.set_result(ExecutionResult(status=self.status, stdout=source))

        threading.Thread(target=answer, daemon=True).start()
        return future

    def alive(self):
        return self.up

    def close(self):
        pass


def test_a_slow_worker_is_dropped_at_the_deadline_and_its_answer_discarded():
    slow, fast = ScriptedWorker("slow", delay=1.0), ScriptedWorker("fast", slots=3)
    with FanOut([slow, fast], environment="test", deadline_s=0.3) as ex:
        futures = [ex.submit(f"p{i}") for i in range(4)]
        results = [f.result(timeout=5) for f in futures]
        stuck = [r for r in results if r.status == "infra_error"]
        assert len(stuck) == 1 and stuck[0].message.startswith(DEADLINE_MESSAGE)
        assert sorted(r.stdout for r in results if r.ok) == sorted(fast.started)
        time.sleep(1.0)  # the slow worker answers late: not counted as a result
        assert ex.stats["dropped"] == 1 and ex.stats["late"] == 1
        assert ex.stats["submitted"] == ex.stats["results"] == 4


@pytest.mark.parametrize("deadline_s", [1e10, float("inf")])
def test_a_deadline_past_what_threads_can_wait_runs_every_program(deadline_s):
    # Before: 1e10 s (past threading.TIMEOUT_MAX) raised OverflowError in the dispatcher
    # thread while a program ran, so the programs queued behind it never started.
    worker = ScriptedWorker("one", slots=1, delay=0.2)
    with FanOut([worker], environment="test", deadline_s=deadline_s) as ex:
        results = [ex.submit(f"p{i}").result(timeout=60) for i in range(3)]
    assert [(r.status, r.stdout) for r in results] == [("ok", f"p{i}") for i in range(3)]
    with pytest.raises(ValueError, match="deadline_s > 0"):
        FanOut([worker], environment="test", deadline_s=float("nan"))


def test_lost_programs_run_on_another_worker_once():
    dying, healthy = ScriptedWorker("dying", slots=2, delay=0.05, dies=True), ScriptedWorker("ok")
    with FanOut([dying, healthy], environment="test") as ex:
        results = ex.map([f"p{i}" for i in range(5)])
    assert [r.stdout for r in results] == [f"p{i}" for i in range(5)]
    assert all(r.ok for r in results)
    assert ex.live_workers == ["ok"] and ex.per_worker == {"ok": 5}
    assert ex.stats["lost"] == ex.stats["retries"] == len(dying.started) >= 1
    assert ex.stats["results"] == 5


def test_without_rerun_lost_a_program_whose_worker_died_under_it_runs_once():
    dying, healthy = ScriptedWorker("dying", slots=2, delay=0.05, dies=True), ScriptedWorker("ok")
    with FanOut([dying, healthy], environment="test", rerun_lost=False) as ex:
        results = ex.map([f"p{i}" for i in range(5)])
    lost = [r for r in results if not r.ok]
    assert len(lost) == len(dying.started) >= 1  # each resolved as lost, none ran again
    assert all(r.status == "infra_error" for r in lost)
    assert all("dying lost while the program ran (not run again" in r.message for r in lost)
    assert sorted(healthy.started) == sorted(r.stdout for r in results if r.ok)
    assert not set(healthy.started) & set(dying.started)
    assert ex.stats["lost"] == len(dying.started) and ex.stats["retries"] == 0
    assert ex.stats["results"] == 5


def test_retries_stop_after_max_retries_and_a_programs_own_failure_is_not_retried():
    flaky = ScriptedWorker("flaky", status="infra_error")  # alive, but every run fails
    with FanOut([flaky], environment="test", max_retries=2) as ex:
        assert ex.run("p").status == "infra_error"
        assert len(flaky.started) == 3 and ex.stats["lost"] == 3 and ex.stats["retries"] == 2
    failing = ScriptedWorker("w", status="error")
    with FanOut([failing], environment="test", max_retries=2) as ex:
        assert ex.run("p").status == "error" and len(failing.started) == 1


def test_nothing_alive_resolves_the_queue_instead_of_waiting_forever():
    dead = ScriptedWorker("dead", dies=True)
    with FanOut([dead], environment="test", refresh_interval_s=0.1) as ex:
        futures = [ex.submit(f"p{i}") for i in range(3)]
        results = [f.result(timeout=5) for f in futures]
    assert [r.status for r in results] == ["infra_error"] * 3
    assert ex.stats["results"] == 3


def test_close_resolves_queued_programs_and_refuses_new_ones():
    ex = FanOut([ScriptedWorker("w", delay=0.3)], environment="test")
    futures = [ex.submit(f"p{i}") for i in range(3)]
    while ex.busy["w"] == 0:  # the first one runs: close waits for it, drops the others
        time.sleep(0.01)
    ex.close()
    assert futures[0].result().ok
    assert [f.result().status for f in futures[1:]] == ["infra_error"] * 2
    with pytest.raises(RuntimeError, match="closed"):
        ex.submit("p")


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="at least one worker"):
        FanOut([], environment="test")
    with pytest.raises(ValueError, match="slots >= 1"):
        FanOut([ScriptedWorker("w", slots=0)], environment="test")
    with pytest.raises(ValueError, match="max_retries"):
        FanOut([ScriptedWorker("w")], environment="test", max_retries=-1)
    with FanOut([ScriptedWorker("w")], environment="test") as ex:
        with pytest.raises(ValueError, match="not a directory"):
            ex.submit("p", input_dir="/nonexistent/wmrl-input")
        with pytest.raises(ValueError, match="relative path"):
            ex.submit("p", files={"../escape.py": "x"})
        assert ex.stats["submitted"] == 0
    with pytest.raises(ValueError, match="list of URLs"):
        EnginePool("unix:///a.sock")
    with pytest.raises(ValueError, match="2 engines but 1 slot"):
        EnginePool(["unix:///a.sock", "unix:///b.sock"], slots=[1])
    with pytest.raises(ValueError, match="each once"):
        EnginePool(["unix:///a.sock", "unix:///a.sock"])
    with pytest.raises(InfraError, match="no Docker engine answers"):
        EnginePool(["unix:///nonexistent/wmrl-a.sock", "unix:///nonexistent/wmrl-b.sock"])


def test_engines_from_env():
    env = {"WMRL_DOCKER_ENGINES": "unix:///a.sock=4, tcp://h:2375,ssh://u@h=1"}
    assert engines_from_env(env) == [("unix:///a.sock", 4), ("tcp://h:2375", 2), ("ssh://u@h", 1)]
    for bad in ("", "unix:///a.sock=0", "unix:///a.sock=x", "=3"):
        with pytest.raises(ValueError, match="WMRL_DOCKER_ENGINES"):
            engines_from_env({"WMRL_DOCKER_ENGINES": bad})
