"""Side effects once, their results everywhere (`wmrl_jax.train.multihost`), in one process:
process 0 and another process are played in turn, the broadcast replaced by a queue of
what process 0 sent. The real two-process run is test_distributed_trainer.py."""

import concurrent.futures
import dataclasses
import math

import jax
import ml_collections
import numpy as np
import pytest

from wmrl_jax.envs.outcomes import Outcome
from wmrl_jax.train import distributed, multihost
from wmrl_jax.train import step as step_lib
from wmrl_jax.train.config import ConfigError
from wmrl_jax.train.execution import Runner


@dataclasses.dataclass(frozen=True)
class _Task:
    id: str


class _Source:
    """Answers `len(program) / 10` after `failures[program]` infrastructure errors."""

    fingerprint = "fake:1"
    num_replicates = 2

    def __init__(self, failures=None):
        self.failures = dict(failures or {})
        self.calls = []

    def submit(self, task, source, *, replicate=0):
        self.calls.append((task.id, source, replicate))
        future = concurrent.futures.Future()
        if self.failures.get(source, 0) > 0:
            self.failures[source] -= 1
            future.set_result(Outcome("infra_error", math.nan, math.nan, math.nan, 0.5, "down"))
        else:
            reward = len(source) / 10 + replicate
            future.set_result(Outcome("ok", reward, 0.5, reward, 1.5 + replicate, ""))
        return future

    def close(self):
        pass


class _Wire:
    """`multihost.agree` between a played process 0 and a played other process."""

    def __init__(self, monkeypatch):
        self.sent, self.primary = [], True
        monkeypatch.setattr(multihost.distributed, "is_primary", lambda: self.primary)
        monkeypatch.setattr(multihost, "agree", self.agree)

    def agree(self, value):
        if self.primary:
            self.sent.append(value)
            return value
        return self.sent.pop(0)


TASKS = [_Task("a"), _Task("b")]
PROGRAMS = ["x = 1", "y = 22", "x = 1", "zz = 333"]  # rows 0 and 2: the same program


def _step(source, *, retries=1, on_infra_error="wm_only", steps=3):
    """Steps of submit + exchange(collect) through `SharedOutcomes`; what came back."""
    shared = multihost.SharedOutcomes(source, environment="fake executor")
    runner = Runner(shared, retries=retries, on_infra_error=on_infra_error, seed=3)
    got = []
    for _ in range(steps):
        pending = runner.submit(TASKS, PROGRAMS, [0, 1, 2, 3], 2)
        got.append(shared.exchange(lambda p=pending: runner.collect(p, TASKS, PROGRAMS, 2)))
    return shared, runner, got


def test_other_processes_see_process_0s_executions_and_run_nothing(monkeypatch):
    wire = _Wire(monkeypatch)
    source = _Source(failures={"y = 22": 1, "zz = 333": 5})  # one retried, one dropped
    shared, runner, want = _step(source)
    assert shared.environment == "fake executor" and shared.num_replicates == 2
    executed = len(source.calls)

    wire.primary = False
    other, other_runner, got = _step(None)
    assert len(source.calls) == executed  # nothing executed again
    assert (other.fingerprint, other.environment) == ("fake:1", "fake executor")
    assert not wire.sent  # every answer used
    # Step 1: "y = 22" retried once, "zz = 333" dropped after its retry; step 2: each
    # program's other replicate (a pair with the first), "zz = 333" dropped again;
    # step 3: the first replicates again, from the cache, and "zz = 333" at last.
    assert [(g.counts["infra_errors"], g.counts["dropped"], g.counts["cached"]) for g in want] == [
        (3, 1, 0),
        (2, 1, 0),
        (1, 0, 3),
    ]
    assert sorted(want[1].partners) == [0, 1, 2]
    for a, b in zip(want, got, strict=True):
        assert a.counts == b.counts and a.executions == b.executions
        assert a.exec_seconds == b.exec_seconds
        assert a.outcomes == b.outcomes and a.partners == b.partners
    assert other_runner.cache_state() == runner.cache_state()
    assert other_runner.remembered(TASKS, PROGRAMS, 2)[1].tolist() == [2, 2, 2, 1]


def test_an_error_on_process_0_stops_the_others(monkeypatch):
    wire = _Wire(monkeypatch)
    with pytest.raises(RuntimeError, match="retries spent"):
        _step(_Source(failures={"x = 1": 9}), on_infra_error="raise", steps=1)
    wire.primary = False
    with pytest.raises(RuntimeError, match="process 0 stopped: RuntimeError: sandbox"):
        _step(None, on_infra_error="raise", steps=1)


def test_a_process_out_of_step_is_an_error(monkeypatch):
    wire = _Wire(monkeypatch)
    _step(_Source(), steps=1)
    wire.primary = False
    shared = multihost.SharedOutcomes(None)
    runner = Runner(shared, retries=1, on_infra_error="wm_only")
    rows = [0, 1, 2, 3, 0]  # one more submission than process 0 made
    pending = runner.submit(TASKS, [*PROGRAMS, "extra"], rows, 2)
    with pytest.raises(RuntimeError, match="out of step"):
        shared.exchange(lambda: runner.collect(pending, TASKS, PROGRAMS, 2))


def test_evaluations_run_on_process_0_only(monkeypatch):
    wire = _Wire(monkeypatch)
    source = _Source()
    shared = multihost.SharedOutcomes(source)
    assert shared.evaluation_source() is source
    wire.primary = False
    stand_in = multihost.SharedOutcomes(None).evaluation_source()
    assert stand_in.submit(TASKS[0], "x = 1").result().status == "infra_error"
    assert len(source.calls) == 0


def test_one_process_passes_through():
    value = {"eval/heldout_percentile": 0.25, "nan": math.nan}
    assert multihost.agree(value) is value
    mesh = step_lib.make_mesh_from_config(ml_collections.ConfigDict(dict(data=1, fsdp=1, tensor=1)))
    multihost.check_mesh(mesh)
    assert multihost.join(ml_collections.ConfigDict(dict(distributed=distributed.default_config())))
    config = step_lib.default_step_config()
    train_step = step_lib.make_train_step(None, None, config, mesh)
    batch = {k: np.ones((4, 3), dtype) for k, (_, dtype) in train_step.spec.items()}
    placed = multihost.place_batch(batch, train_step)
    for k, x in placed.items():
        assert isinstance(x, jax.Array) and x.sharding == train_step.batch_shardings[k]
        np.testing.assert_array_equal(np.asarray(x), batch[k])


def test_a_layout_joined_too_late_is_a_config_error():
    jax.devices()  # The backends are up: too late to join.
    config = ml_collections.ConfigDict(dict(distributed=distributed.default_config()))
    config.distributed.coordinator = "127.0.0.1:9"
    config.distributed.num_processes, config.distributed.process_id = 2, 1
    with pytest.raises(ConfigError, match="process 1 of 2 .* could not join"):
        multihost.join(config)
    config.distributed.process_id = 5
    with pytest.raises(ConfigError, match="config.distributed: bad process layout"):
        multihost.join(config)
