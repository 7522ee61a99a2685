"""The training loop end to end on the built-in suite, and its robustness paths."""

from __future__ import annotations

import concurrent.futures
import logging
import math
import os

import numpy as np
import pytest

from experiments.configs import tiny_cpu
from wmrl_jax.agents.base import WMOutput
from wmrl_jax.envs.outcomes import Outcome
from wmrl_jax.train import builder, loop
from wmrl_jax.train.config import ConfigError, override
from wmrl_jax.train.evaluation import ExecutionFailure
from wmrl_jax.train.lock import WorkdirBusy, WorkdirLock


def _config(**overrides):
    # Without the execution cache every anchor row is one execution (exact counts below);
    # the resume and budget tests turn it on.
    base = {"executor.kind": "replay", "num_steps": 3, "eval_every": 3, "checkpoint.every": 1,
            "executor.cache": False}  # fmt: skip
    return override(tiny_cpu.get_config("runlocal"), **{**base, **overrides})


class _Wrapped:
    """An outcome source that rewrites the replay executor's answers."""

    fingerprint = None

    def __init__(self, inner, rewrite):
        self.inner, self.rewrite, self.calls = inner, rewrite, 0
        self.num_replicates = inner.num_replicates

    def submit(self, task, source, *, replicate=0):
        self.calls += 1
        out = self.inner.submit(task, source, replicate=replicate).result()
        fut = concurrent.futures.Future()
        fut.set_result(self.rewrite(out, self.calls))
        return fut

    def close(self):
        pass


def _replay(config):
    return builder.make_outcomes(config)[0]


def _strip(history):
    """Metrics that must agree between runs: everything but measured seconds (NaN as None,
    so that an undefined diagnostic compares equal to itself)."""
    return [{k: None if v != v else v for k, v in h.items() if "seconds" not in k} for h in history]


@pytest.mark.parametrize("arm", ["real", "anchors_only", "wm_naive", "wm_debias", "wmrl"])
def test_every_arm_runs_and_logs(tmp_path, arm):
    config = _config(arm=arm, num_steps=2, eval_every=2)
    summary = loop.train_and_evaluate(config, str(tmp_path))
    assert 0.0 <= summary["heldout_before"] <= 1.0 and 0.0 <= summary["heldout_after"] <= 1.0
    ledger = summary["ledger"]
    g, tasks = config.group_size, config.tasks_per_step
    expected = {"real": 2 * tasks * g, "wm_naive": 0}.get(arm, 2 * g)
    assert ledger["executions"] == expected
    assert (ledger["exec_seconds"] > 0) == (expected > 0)
    with_wm = arm not in ("real", "anchors_only")
    assert ledger["gen_tokens"] > 0 and (ledger["wm_tokens"] > 0) == with_wm
    last = summary["steps"][-1]
    # anchors_only samples, executes and trains on its anchor group alone.
    sampled = 2 * g if arm == "anchors_only" else 2 * tasks * g
    assert ledger["samples"] == sampled and ledger["wm_rows"] == (sampled if with_wm else 0)
    # Policy rows, plus the world model's auxiliary rows (one per executed sample), per epoch.
    assert ledger["train_rows"] == (sampled + expected) * config.train.num_epochs
    assert last["reward/masked_rows"] == 0
    assert ledger["accelerator_seconds"] == 0.0  # a CPU host: no device-seconds charged
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3  # Step 0 (the evaluation before training), 1 and 2.


def test_resume_gives_the_same_run(tmp_path):
    # With the execution cache: it travels with the checkpoint.
    config = _config(num_steps=4, eval_every=2, **{"checkpoint.every": 10, "executor.cache": True})
    full = loop.train_and_evaluate(config, str(tmp_path / "full"))
    first = loop.Trainer(config, str(tmp_path / "split"))
    first.run(until=3)  # Preempted after step 3 (checkpointed there).
    first.close()
    resumed = loop.train_and_evaluate(config, str(tmp_path / "split"))
    assert _strip(resumed["history"]) == _strip(full["history"])
    assert resumed["ledger"]["executions"] == full["ledger"]["executions"]
    assert resumed["ledger"]["cached"] == full["ledger"]["cached"]
    assert _strip(resumed["steps"]) == _strip(full["steps"])  # summary.json keeps every step
    assert resumed["ledger"]["gen_tokens"] == full["ledger"]["gen_tokens"]


def test_resume_refuses_checkpoints_of_another_run(tmp_path):
    config = _config(num_steps=1, eval_every=1)
    workdir = str(tmp_path / "run")
    loop.train_and_evaluate(config, workdir)
    # The schedule spans num_steps: a longer run would change the learning rates.
    with pytest.raises(ValueError, match="learning-rate schedule's length"):
        loop.Trainer(override(config, num_steps=2), workdir)
    # With a fixed schedule, longer training and another cadence continue the same run.
    config = override(config, **{"optimizer.total_steps": 10})
    workdir = str(tmp_path / "fixed")
    loop.train_and_evaluate(config, workdir)
    longer = override(config, num_steps=2, eval_every=2)
    assert loop.train_and_evaluate(longer, workdir)["ledger"]["executions"] > 0
    other = override(longer, seed=longer.seed + 1, **{"train.loss.kl_coef": 0.5})
    with pytest.raises(ValueError, match=r"another run \(config seed; config train.loss.kl_coef\)"):
        loop.Trainer(other, workdir)
    # The same config on a table whose answers changed (a refreshed board, a rebuild).
    replay = _replay(longer)
    table = replay.table
    board = next(iter(table.boards[table.task_ids[0]]))
    table.boards[table.task_ids[0]][board] = table.boards[table.task_ids[0]][board] + 1.0
    with pytest.raises(ValueError, match=r"another run \(outcome source \(replay:"):
        loop.Trainer(longer, workdir, outcomes=replay)


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
        ("agent.kind", "text", "config.agent.text"),
        ("correction.real_var_prior", math.nan, "config.correction.real_var_prior"),
        ("checkpoint.every", 0, "config.checkpoint.every"),
        ("agent.recipe.warm_start.steps", -1, "config.agent.recipe.warm_start.steps"),
        ("budget.compute_seconds", 100.0, "optimizer.total_steps"),
    ],
)
def test_bad_configs_fail_before_any_work(tmp_path, field, value, match):
    config = _config(**{field: value})
    with pytest.raises(ConfigError, match=match):
        loop.Trainer(config, str(tmp_path))
    assert not (tmp_path / "checkpoints").exists()


def test_equal_compute_budget_stops_and_evaluates_on_the_compute_grid(tmp_path):
    config = _config(
        arm="real", num_steps=50, **{"budget.compute_seconds": 60.0, "budget.eval_points": 3,
                                     "optimizer.total_steps": 50, "executor.cache": True}
    )  # fmt: skip
    summary = loop.train_and_evaluate(config, str(tmp_path))
    spent = [h["gen_seconds"] + h["wm_seconds"] + h["exec_seconds"] for h in summary["history"]]
    assert spent[-1] >= 60.0 and len(summary["steps"]) < 50  # Stopped by the budget.
    before_last = summary["steps"][-2]["ledger/compute_seconds"]
    assert before_last < 60.0  # ... at the first step that reached it.
    # One evaluation at the start, one per grid point crossed (20, 40, 60 s).
    crossed = [int(s // 20.0) for s in spent]
    assert crossed == sorted(set(crossed)) and crossed[0] == 0 and crossed[-1] >= 3


def test_replicate_pairs_estimate_the_real_noise(tmp_path):
    # Every group executed, with the cache: a program sampled again gets its next
    # replicate (charged) until all three are known, then answers from the cache. Groups
    # of 16 so that the warm-started policy draws some program twice (with groups of 4 and
    # the task observations' longer prompt, no program recurred in 4 steps).
    config = _config(arm="wmrl", num_steps=4, eval_every=4, anchor_fraction=1.0,
                     group_size=16, **{"executor.cache": True})  # fmt: skip
    summary = loop.train_and_evaluate(config, str(tmp_path))
    steps, ledger = summary["steps"], summary["ledger"]
    rows = 4 * config.tasks_per_step * config.group_size
    assert ledger["executions"] + ledger["cached"] == rows
    pairs = sum(s["anchors/replicate_pairs"] for s in steps)
    assert 0 < pairs < ledger["executions"]
    # sigma2_real is estimated from the pairs, no longer the prior alone.
    assert steps[-1]["correction/sigma2_real"] != pytest.approx(config.correction.real_var_prior)
    assert all(np.isfinite(s["correction/sigma2_real"]) for s in steps)


@pytest.mark.parametrize("arm", ["real", "wm_naive", "wmrl"])
def test_samples_without_a_program_are_invalid_and_never_executed(tmp_path, arm):
    config = _config(arm=arm, num_steps=1, eval_every=1)
    source = _Wrapped(_replay(config), lambda out, n: out)
    trainer = loop.Trainer(config, str(tmp_path), outcomes=source)
    sample = trainer.agent.rollout

    def odd_rows_hold_no_program(params, tasks, *, group_size, key):
        ro = sample(params, tasks, group_size=group_size, key=key)
        causes = tuple("no_code" if i % 2 else "ok" for i in range(len(ro.programs)))
        programs = [p if c == "ok" else "" for p, c in zip(ro.programs, causes, strict=True)]
        return ro._replace(programs=programs, causes=causes)

    trainer.agent.rollout = odd_rows_hold_no_program
    records = []
    trainer.hooks = (lambda record: records.append(record) or {},)
    metrics = trainer._step(1)
    trainer.close()
    (record,) = records
    n, g = record.num_rows, config.group_size
    none = np.arange(n) % 2 == 1
    ran = int(np.sum(np.repeat(record.anchors.groups, g) & ~none))  # anchors with a program
    assert ran > 0 or arm == "wm_naive"
    assert source.calls == ran and metrics["ledger/executions"] == ran
    ex = record.execution
    assert not ex.executed[none].any() and all(i % 2 == 0 for i in ex.results)
    floor = builder.reward_floors(config).invalid
    np.testing.assert_array_equal(record.fed.rewards[none], floor)
    assert record.fed.valid[none].all()
    assert metrics["programs/none/no_code"] == n // 2


def test_adaptive_rho_follows_the_error_and_resumes_exactly(tmp_path):
    # A short memory so that four steps move ρ; the state travels with the checkpoint.
    config = _config(arm="wmrl_adaptive", num_steps=4, eval_every=2, **{
        "checkpoint.every": 10, "anchors.adaptive.warmup_steps": 1, "anchors.adaptive.rho_max": 1.0,
        "anchors.adaptive.fast_halflife": 1.0, "anchors.adaptive.slow_halflife": 20.0,
    })  # fmt: skip
    full = loop.train_and_evaluate(config, str(tmp_path / "full"))
    fractions = [s["anchors/fraction"] for s in full["steps"]]
    groups = config.tasks_per_step
    base = 1 / groups  # wmrl's one group of tasks_per_step (ρ·B < 1): where ρ_t starts
    assert fractions[0] == pytest.approx(base)  # nothing measured yet
    assert any(abs(f - base) > 1e-3 for f in fractions[2:])  # two measured steps differ
    for s, f in zip(full["steps"], fractions, strict=True):  # ⌊ρB⌋ or ⌈ρB⌉ groups
        assert math.floor(f * groups) <= s["anchors/groups"] <= math.ceil(f * groups)
    first = loop.Trainer(config, str(tmp_path / "split"))
    first.run(until=3)
    first.close()
    resumed = loop.train_and_evaluate(config, str(tmp_path / "split"))
    assert _strip(resumed["steps"]) == _strip(full["steps"])
    assert resumed["ledger"]["executions"] == full["ledger"]["executions"]


class _Switch(_Wrapped):
    """Replay answers, or infrastructure errors while `down`; records `close`."""

    def __init__(self, inner):
        super().__init__(inner, lambda out, n: _infra(out) if self.down else out)
        self.down, self.closed = False, 0

    def close(self):
        self.closed += 1


def _infra(out):
    return out._replace(status="infra_error", reward=math.nan, percentile=math.nan,
                        message="the engine is gone")  # fmt: skip


def test_evaluation_infra_errors_are_masked_and_never_rank_best(tmp_path):
    config = _config(num_steps=2, eval_every=1, **{"checkpoint.keep": 5})
    source = _Switch(_replay(config))

    def hook(record):  # Step 1's evaluation sees a dead engine; step 2's a working one.
        source.down = record.step == 1
        return {}

    trainer = loop.Trainer(config, str(tmp_path), outcomes=source, hooks=[hook], console=True)
    summary = trainer.run()
    trainer.close()
    first, down, up = summary["history"]
    heldout = len(trainer.tasks.heldout)
    assert math.isnan(down["eval/heldout_percentile"])  # not 0.000
    executions = heldout * max(config.eval_samples, 1)  # Programs per held-out task.
    assert down["eval/infra_errors"] == executions and up["eval/infra_errors"] == 0
    assert np.isfinite(up["eval/heldout_percentile"])
    # Retention never saw a 0 for step 1: it has no metric, step 2 has its real one.
    assert not (trainer.checkpointer.metrics(1) or {}).get("eval/heldout_percentile")
    assert trainer.checkpointer.metrics(2)["eval/heldout_percentile"] == pytest.approx(
        up["eval/heldout_percentile"]
    )
    assert source.closed == 1


def test_a_run_whose_every_execution_fails_stops_with_an_error(tmp_path, capsys):
    config = _config(num_steps=5, eval_every=5, **{"executor.max_infra_steps": 3})
    source = _Switch(_replay(config))
    source.down = True
    trainer = loop.Trainer(config, str(tmp_path), outcomes=source, console=True)
    # The evaluation before training, then steps 1 and 2: three in a row.
    with pytest.raises(ExecutionFailure, match=r"last 3 steps or evaluations, up to step 2"):
        trainer.run()
    trainer.close()
    assert "held-out percentile n/a" in capsys.readouterr().out
    assert len(trainer.progress.steps) == 1 and source.closed == 1


def test_a_second_trainer_on_a_busy_workdir_fails_at_once(tmp_path):
    config = _config(num_steps=1, eval_every=1)
    first = loop.Trainer(config, str(tmp_path))
    with pytest.raises(WorkdirBusy, match=rf"in use by another trainer \(pid {os.getpid()}\)"):
        loop.Trainer(config, str(tmp_path))
    first.run()
    first.close()
    loop.Trainer(config, str(tmp_path)).close()  # released by close


def test_an_interrupted_run_closes_its_executor_and_lock(tmp_path):
    config = _config(num_steps=3, eval_every=3)
    source = _Switch(_replay(config))
    submit = source.submit

    def interrupted(task, program, *, replicate=0):
        if source.calls >= 10:  # A signal arriving mid-step (SIGTERM becomes an exception).
            raise KeyboardInterrupt
        return submit(task, program, replicate=replicate)

    source.submit = interrupted
    with pytest.raises(KeyboardInterrupt):
        loop.train_and_evaluate(config, str(tmp_path), outcomes=source)
    assert source.closed == 1
    WorkdirLock.acquire(str(tmp_path)).release()  # the lock went with the trainer


def test_a_trainer_stopped_while_building_closes_what_it_opened(tmp_path, monkeypatch):
    config = _config()
    source = _Switch(_replay(config))

    def stopped(*args, **kwargs):  # A signal while the checkpoints are opened.
        raise KeyboardInterrupt

    monkeypatch.setattr(loop, "Checkpointer", stopped)
    with pytest.raises(KeyboardInterrupt):
        loop.Trainer(config, str(tmp_path), outcomes=source)
    assert source.closed == 1
    WorkdirLock.acquire(str(tmp_path)).release()


def test_the_trainer_hands_every_task_it_grades_to_the_outcome_source(tmp_path, monkeypatch):
    # The source's fingerprint covers the tasks' grader side (answers, boards), so that
    # the resume guard refuses a resume after they were edited.
    seen = []
    make = builder.make_outcomes

    def recording(config, **kw):
        seen.append(kw.get("tasks", ()))
        return make(config, **kw)

    monkeypatch.setattr(builder, "make_outcomes", recording)
    trainer = loop.Trainer(_config(num_steps=1), str(tmp_path / "run"))
    try:
        sets = trainer.tasks
        graded = sorted(t.id for t in [*sets.train, *sets.heldout, *sets.pretrain])
        assert len(seen) == 1 and sorted(t.id for t in seen[0]) == graded
        assert sets.train and sets.heldout
    finally:
        trainer.close()
