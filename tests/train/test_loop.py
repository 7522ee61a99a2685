"""The training loop end to end on the built-in suite, and its robustness paths."""

from __future__ import annotations

import concurrent.futures
import logging
import math

import jax
import numpy as np
import pytest

from experiments.configs import tiny_cpu
from wmrl_jax.envs.outcomes import Outcome
from wmrl_jax.train import components, loop
from wmrl_jax.train.agent import WMOutput


def _config(**overrides):
    base = {"executor.kind": "replay", "num_steps": 3, "eval_every": 3, "checkpoint.every": 1}
    return components.override(tiny_cpu.get_config("runlocal"), **{**base, **overrides})


class _Wrapped:
    """An outcome source that rewrites the replay executor's answers."""

    def __init__(self, inner, rewrite):
        self.inner, self.rewrite, self.calls = inner, rewrite, 0

    def submit(self, task, source):
        self.calls += 1
        out = self.inner.submit(task, source).result()
        fut = concurrent.futures.Future()
        fut.set_result(self.rewrite(out, self.calls))
        return fut

    def close(self):
        pass


def _replay(config):
    return components.make_outcomes(config)[0]


def _strip(history):
    """Metrics that must agree between runs: everything but measured seconds."""
    return [{k: v for k, v in h.items() if "seconds" not in k} for h in history]


def test_choose_anchor_groups():
    key = jax.random.key(0)
    kw = dict(num_groups=10, fraction=0.1, policy="random")
    assert choose(key, "real", **kw).all()
    assert not choose(key, "wm_naive", **kw).any()
    assert choose(key, "wmrl", **kw).sum() == 1
    assert choose(key, "wmrl", **{**kw, "fraction": 0.0}).sum() == 1  # At least one group.
    assert choose(key, "wmrl", **{**kw, "fraction": 0.3}).sum() == 3
    var = np.arange(10.0)
    picked = choose(key, "wmrl", **{**kw, "fraction": 0.2, "policy": "uncertain"}, group_var=var)
    assert np.flatnonzero(picked).tolist() == [8, 9]


def choose(key, arm, **kw):
    return loop.choose_anchor_groups(key, arm=arm, **kw)


def test_step_tasks_is_a_function_of_seed_and_step():
    tasks = list(range(12))
    a = loop.step_tasks(tasks, seed=0, step=3, count=5)
    assert a == loop.step_tasks(tasks, seed=0, step=3, count=5)
    assert len(set(a)) == 5
    assert a != loop.step_tasks(tasks, seed=0, step=4, count=5)
    b = loop.step_tasks(tasks, seed=0, step=3, count=30)  # More groups than tasks.
    assert (
        sorted(set(b)) == tasks
        and max(b.count(t) for t in tasks) - min(b.count(t) for t in tasks) <= 1
    )


@pytest.mark.parametrize("arm", ["real", "wm_naive", "wm_debias", "wmrl"])
def test_every_arm_runs_and_logs(tmp_path, arm):
    config = _config(arm=arm, num_steps=2, eval_every=2)
    summary = loop.train_and_evaluate(config, str(tmp_path))
    assert 0.0 <= summary["heldout_before"] <= 1.0 and 0.0 <= summary["heldout_after"] <= 1.0
    ledger = summary["ledger"]
    g, tasks = config.group_size, config.tasks_per_step
    expected = {"real": 2 * tasks * g, "wm_naive": 0}.get(arm, 2 * g)
    assert ledger["executions"] == expected
    assert (ledger["exec_seconds"] > 0) == (expected > 0)
    assert ledger["gen_tokens"] > 0 and (ledger["wm_tokens"] > 0) == (arm != "real")
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3  # Step 0 (the evaluation before training), 1 and 2.


def test_resume_gives_the_same_run(tmp_path):
    config = _config(num_steps=4, eval_every=2, **{"checkpoint.every": 10})
    full = loop.train_and_evaluate(config, str(tmp_path / "full"))
    first = loop.Trainer(config, str(tmp_path / "split"))
    first.run(until=3)  # Preempted after step 3 (checkpointed there).
    first.close()
    resumed = loop.train_and_evaluate(config, str(tmp_path / "split"))
    assert _strip(resumed["history"]) == _strip(full["history"])
    assert resumed["ledger"]["executions"] == full["ledger"]["executions"]
    assert resumed["ledger"]["gen_tokens"] == full["ledger"]["gen_tokens"]


def test_resume_refuses_checkpoints_of_another_run(tmp_path):
    config = _config(num_steps=1, eval_every=1)
    workdir = str(tmp_path / "run")
    loop.train_and_evaluate(config, workdir)
    # Longer training and another evaluation cadence continue the same run.
    longer = components.override(config, num_steps=2, eval_every=2)
    assert loop.train_and_evaluate(longer, workdir)["ledger"]["executions"] > 0
    other = components.override(longer, seed=longer.seed + 1, **{"train.loss.kl_coef": 0.5})
    with pytest.raises(ValueError, match=r"another run \(config seed; config train.loss.kl_coef\)"):
        loop.Trainer(other, workdir)
    # The same config on a table whose answers changed (a refreshed board, a rebuild).
    replay = _replay(longer)
    table = replay.table
    board = next(iter(table.boards[table.task_ids[0]]))
    table.boards[table.task_ids[0]][board] = table.boards[table.task_ids[0]][board] + 1.0
    with pytest.raises(ValueError, match=r"another run \(outcome source \(replay:"):
        loop.Trainer(longer, workdir, outcomes=replay)
    assert loop.resume_mismatch({"a": {"b": 1}, "num_steps": 1}, {"a": {"b": 2}}) == ["a.b"]


def test_infra_errors_are_retried_then_fall_back(tmp_path, caplog):
    config = _config(num_steps=1, eval_every=1)
    down = lambda out, n: out._replace(status="infra_error", reward=math.nan)  # noqa: E731
    trainer = loop.Trainer(config, str(tmp_path), outcomes=_Wrapped(_replay(config), down))
    with caplog.at_level(logging.WARNING):
        metrics = trainer._step(1)
    trainer.close()
    g = config.group_size
    assert metrics["anchors/dropped"] == g
    assert metrics["anchors/infra_errors"] == g * (config.executor.infra_retries + 1)
    assert "infrastructure" in caplog.text
    assert np.isfinite(metrics["train/loss"])


def test_infra_errors_can_stop_training(tmp_path):
    config = _config(num_steps=1, eval_every=1, **{"executor.on_infra_error": "raise"})
    down = lambda out, n: out._replace(status="infra_error", reward=math.nan)  # noqa: E731
    trainer = loop.Trainer(config, str(tmp_path), outcomes=_Wrapped(_replay(config), down))
    with pytest.raises(RuntimeError, match="infrastructure"):
        trainer._step(1)
    trainer.close()


def test_nonfinite_rewards_are_rejected_and_counted(tmp_path, caplog):
    config = _config(num_steps=1, eval_every=1)
    nan = lambda out, n: out._replace(reward=math.nan if n % 2 else math.inf)  # noqa: E731
    trainer = loop.Trainer(config, str(tmp_path), outcomes=_Wrapped(_replay(config), nan))
    with caplog.at_level(logging.WARNING):
        metrics = trainer._step(1)
    trainer.close()
    assert metrics["anchors/nonfinite"] == config.group_size
    assert "non-finite" in caplog.text
    assert np.isfinite(metrics["train/loss"])


def test_a_group_whose_solutions_all_fail(tmp_path):
    config = _config(arm="real", num_steps=1, eval_every=1)
    crash = lambda out, n: Outcome("error", -0.5, math.nan, math.nan, 1.0, "boom")  # noqa: E731
    trainer = loop.Trainer(config, str(tmp_path), outcomes=_Wrapped(_replay(config), crash))
    metrics = trainer._step(1)
    trainer.close()
    assert metrics["reward/fed_mean"] == -0.5
    # Equal rewards: zero advantages, so no policy gradient (the WM's own loss remains).
    assert metrics["train/pg_loss"] == 0.0 and np.isfinite(metrics["train/loss"])


def test_world_model_that_never_parses_degrades_to_anchors(tmp_path, caplog):
    config = _config(num_steps=1, eval_every=1)
    trainer = loop.Trainer(config, str(tmp_path))

    def unparseable(params, tasks, rollout, *, key):
        n = len(rollout.programs)
        return WMOutput(np.full(n, np.nan, np.float32), np.full(n, np.inf, np.float32), n, n)

    trainer.agent.predict = unparseable
    with caplog.at_level(logging.WARNING):
        metrics = trainer._step(1)
    trainer.close()
    assert "anchors only" in caplog.text
    assert metrics["wm/parse_failures"] == config.tasks_per_step * config.group_size
    assert np.isfinite(metrics["train/loss"])


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("arm", "wm_magic", "config.arm"),
        ("executor.kind", "cloud", "config.executor.kind"),
        ("anchor_fraction", 1.5, "config.anchor_fraction"),
        ("group_size", 1, "config.group_size"),
        ("agent.kind", "text", "config.agent.checkpoint"),
    ],
)
def test_bad_configs_fail_before_any_work(tmp_path, field, value, match):
    config = _config(**{field: value})
    with pytest.raises(components.ConfigError, match=match):
        loop.Trainer(config, str(tmp_path))
    assert not (tmp_path / "checkpoints").exists()
