"""Overlap (`config.overlap`): step t + 1's batch is sampled while step t's programs execute,
from the params before update t; off, every batch is fresh; a resumed run trains as the
uninterrupted one."""

from __future__ import annotations

import json
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import tiny_cpu
from wmrl_jax.agents.base import Rollout
from wmrl_jax.train import builder, loop, overlap
from wmrl_jax.train import step as step_lib
from wmrl_jax.train.config import override
from wmrl_jax.train.ledger import LedgerStep


def _config(**overrides):
    # With the execution cache (it travels with the checkpoints): an anchor row is either
    # executed or answered from the cache.
    base = {"executor.kind": "replay", "num_steps": 4, "eval_every": 2, "overlap": True,
            "checkpoint.every": 10, "checkpoint.export_hf": False}  # fmt: skip
    return override(tiny_cpu.get_config("runlocal"), **{**base, **overrides})


def _strip(rows):
    """What must agree between runs: all but measured seconds (NaN as None)."""
    return [{k: None if v != v else v for k, v in r.items() if "seconds" not in k} for r in rows]


@pytest.fixture(scope="module")
def prebuilt():
    """A factory of the warm-started agent (built once), each with its own params."""
    config = _config()
    _, model_key = jax.random.split(jax.random.key(config.seed))
    mesh = step_lib.make_mesh_from_config(config.mesh)
    built = builder.build_agent(config, builder.load_tasks(config), model_key, mesh=mesh)
    host = jax.tree.map(np.array, built.params)
    return lambda: built._replace(params=jax.tree.map(jnp.asarray, host))


def _run(config, workdir, prebuilt):
    """Runs `config`; returns the summary, each step's rollout and ledger, the batch it
    sampled ahead, the params after each update (0: before the first), the rollout keys
    and tasks, and the last checkpoint's meta."""
    rollouts, params, ledgers, aheads = {}, {}, {}, {}

    def hook(record):
        rollouts[record.step], ledgers[record.step] = record.rollout, record.ledger
        aheads[record.step] = trainer._ahead
        params[record.step] = jax.tree.map(np.array, trainer.state.params)
        return {}

    trainer = loop.Trainer(config, str(workdir), prebuilt=prebuilt(), hooks=[hook])
    params[0] = jax.tree.map(np.array, trainer.state.params)
    try:
        summary = trainer.run()
        meta = trainer.checkpointer.meta()
    finally:
        trainer.close()
    draws = {}
    for step in rollouts:
        k_roll, k_anchor, _, _ = trainer._step_keys(step)
        draws[step] = (k_roll, trainer._step_tasks(step, k_anchor))
    return {"summary": summary, "rollouts": rollouts, "params": params, "draws": draws,
            "ledgers": ledgers, "aheads": aheads, "meta": meta, "agent": trainer.agent,
            "config": config}  # fmt: skip


@pytest.fixture(scope="module")
def runs(prebuilt, tmp_path_factory):
    """The default arm (wmrl) for four steps, with and without overlap."""
    root = tmp_path_factory.mktemp("overlap")
    return {on: _run(_config(overlap=on), root / str(on), prebuilt) for on in (True, False)}


def _resample(run, step, params_after):
    """Step `step`'s batch sampled afresh from the params after update `params_after`."""
    k_roll, tasks = run["draws"][step]
    params = jax.tree.map(jnp.asarray, run["params"][params_after])
    return run["agent"].rollout(params, tasks, group_size=run["config"].group_size, key=k_roll)


def _same(a: Rollout, b: Rollout) -> bool:
    return a.programs == b.programs and all(
        np.array_equal(a.batch[k], b.batch[k]) for k in ("tokens", "old_logprobs")
    )


def test_the_next_batch_comes_from_the_params_before_the_update(runs):
    run = runs[True]
    assert _same(run["rollouts"][1], _resample(run, 1, 0))  # nothing ahead of step 1
    for step in (2, 3, 4):
        # Sampled during step - 1, before its update: from the params after update step - 2.
        assert _same(run["rollouts"][step], _resample(run, step, step - 2))
        assert not _same(run["rollouts"][step], _resample(run, step, step - 1))
    assert [s["overlap/stale"] for s in run["summary"]["steps"]] == [0.0, 1.0, 1.0, 1.0]


def test_without_overlap_every_batch_is_fresh_and_nothing_changes(runs):
    run = runs[False]
    for step in (1, 2, 3, 4):
        assert _same(run["rollouts"][step], _resample(run, step, step - 1))
    steps = run["summary"]["steps"]
    assert not any(k.startswith("overlap/") for s in steps for k in s)
    assert "ahead" not in run["meta"]
    # Step 1 samples nothing ahead of time in either run: the same step, bit for bit.
    on = _strip(runs[True]["summary"]["steps"])[0]
    assert {k: v for k, v in on.items() if not k.startswith("overlap/")} == _strip(steps)[0]


def test_importance_ratio_of_a_stale_batch_is_not_one(runs):
    # The first epoch of a fresh batch is on-policy: its ratio is 1 up to float32 rounding
    # of the same log-probs computed twice; a stale one's moves by the update in between.
    for on in (True, False):
        for s in runs[on]["summary"]["steps"]:
            deviation = max(abs(s["train/ratio_max"] - 1.0), abs(s["train/ratio_min"] - 1.0))
            stale = on and s["step"] > 1
            assert (deviation > 1e-3) if stale else (deviation < 1e-5), (on, s["step"], deviation)


def test_the_ledger_charges_each_batch_once_to_the_step_that_trains_on_it(runs):
    for run in runs.values():
        ledger = run["summary"]["ledger"]
        assert ledger["gen_tokens"] == sum(r.gen_tokens for r in run["rollouts"].values())
        g = run["config"].group_size
        assert ledger["samples"] == 4 * run["config"].tasks_per_step * g
        # One anchor group per step: each row executed once or answered by the cache.
        assert ledger["executions"] + ledger["cached"] == 4 * g and ledger["executions"] > 0
    run = runs[True]
    assert run["aheads"][4] is None  # the last step samples nothing ahead
    for step in (2, 3, 4):  # A stale step is charged what sampling its batch took, no more.
        ahead = run["aheads"][step - 1]
        assert ahead.step == step and ahead.rollout is run["rollouts"][step]
        assert run["ledgers"][step].gen_seconds == ahead.gen_seconds > 0


@pytest.mark.parametrize("arm", ["anchors_only", "wm_naive"])
def test_every_arm_overlaps_what_it_executes(tmp_path, prebuilt, arm):
    # wmrl (like real and the other arms that execute) is `runs`; anchors_only samples its
    # anchor groups alone; wm_naive executes nothing. Cache off: exact execution counts.
    config = _config(arm=arm, num_steps=2, **{"executor.cache": False})
    run = _run(config, tmp_path, prebuilt)
    ledger, g = run["summary"]["ledger"], config.group_size
    assert ledger["executions"] == {"anchors_only": 2 * g, "wm_naive": 0}[arm]
    assert ledger["gen_tokens"] == sum(r.gen_tokens for r in run["rollouts"].values())
    # wm_naive executes nothing: no batch is sampled ahead, every batch is fresh.
    expected = [0.0, 0.0] if arm == "wm_naive" else [0.0, 1.0]
    assert [s["overlap/stale"] for s in run["summary"]["steps"]] == expected
    assert _same(run["rollouts"][2], _resample(run, 2, 0 if arm != "wm_naive" else 1))


def test_resume_trains_on_the_batch_sampled_ahead(tmp_path, prebuilt, runs):
    # Stopped at a step that is not a checkpoint multiple: the batch it sampled for
    # step 4 is saved with it (as with any checkpoint of a step that sampled ahead).
    full = runs[True]
    config = full["config"]
    first = loop.Trainer(config, str(tmp_path / "split"), prebuilt=prebuilt())
    first.run(until=3)
    meta = first.checkpointer.meta()
    first.close()
    assert meta["step"] == 3 and meta["ahead"]["step"] == 4
    resumed = _run(config, tmp_path / "split", prebuilt)
    assert _same(resumed["rollouts"][4], full["rollouts"][4])
    assert _strip(resumed["summary"]["steps"]) == _strip(full["summary"]["steps"])
    assert _strip(resumed["summary"]["history"]) == _strip(full["summary"]["history"])
    for k in ("executions", "cached", "gen_tokens", "samples", "train_rows"):
        assert resumed["summary"]["ledger"][k] == full["summary"]["ledger"][k], k
    for a, b in zip(jax.tree.leaves(resumed["params"][4]), jax.tree.leaves(full["params"][4]),
                    strict=True):  # fmt: skip
        np.testing.assert_array_equal(a, b)
    assert "ahead" not in resumed["meta"]  # the last step samples nothing ahead


def test_an_error_while_sampling_ahead_stops_the_step_and_says_so(tmp_path, prebuilt, monkeypatch):
    trainer = loop.Trainer(_config(), str(tmp_path), prebuilt=prebuilt())
    rollout, calls = trainer.agent.rollout, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise MemoryError("out of accelerator memory")
        return rollout(*args, **kwargs)

    monkeypatch.setattr(trainer.agent, "rollout", failing)
    try:
        with pytest.raises(
            RuntimeError, match="config.overlap: sampling step 2's batch ahead"
        ) as e:
            trainer._step(1)
        assert isinstance(e.value.__cause__, MemoryError)
    finally:
        trainer.close()


def test_a_batch_sampled_for_other_tasks_is_charged_and_replaced(tmp_path, prebuilt, caplog):
    trainer = loop.Trainer(_config(), str(tmp_path), prebuilt=prebuilt())
    k_roll, k_anchor, _, _ = trainer._step_keys(1)
    tasks = trainer._step_tasks(1, k_anchor)
    wrong = trainer.agent.rollout(trainer.state.params, tasks, group_size=4, key=k_anchor)
    trainer._ahead = overlap.Ahead(1, ("another task",) * len(tasks), wrong, 2.5)
    timing = LedgerStep()
    with caplog.at_level(logging.WARNING):
        rollout, stale = trainer._rollout(1, tasks, k_roll, timing)
    trainer.close()
    assert not stale and "resampling" in caplog.text
    fresh = trainer.agent.rollout(trainer.state.params, tasks, group_size=4, key=k_roll)
    assert _same(rollout, fresh)
    ledger = timing.ledger()
    assert ledger.gen_tokens == wrong.gen_tokens and ledger.gen_seconds > 2.5


def test_a_batch_round_trips_through_checkpoint_json_exactly():
    rng = np.random.default_rng(0)
    batch = {
        "tokens": rng.integers(0, 50, (4, 6)).astype(np.int32),
        "attention_mask": np.ones((4, 6), bool),
        "old_logprobs": rng.normal(size=(4, 6)).astype(np.float32),
    }
    rollout = Rollout(["a", "ü", "", "c"], batch, 24, ("ok", "ok", "empty", "ok"),
                      rng.integers(0, 3, (4, 2)))  # fmt: skip
    ahead = overlap.Ahead(7, ("t1", "t2"), rollout, 0.25)
    back = overlap.decode(json.loads(json.dumps(overlap.encode(ahead))))
    assert (back.step, back.task_ids, back.gen_seconds) == (7, ("t1", "t2"), 0.25)
    assert back.rollout.programs == rollout.programs and back.rollout.causes == rollout.causes
    for k, v in batch.items():
        assert back.rollout.batch[k].dtype == v.dtype
        np.testing.assert_array_equal(back.rollout.batch[k], v)
    np.testing.assert_array_equal(back.rollout.features, rollout.features)
    no_features = overlap.encode(ahead._replace(rollout=rollout._replace(features=None)))
    assert overlap.decode(no_features).rollout.features is None
    with pytest.raises(ValueError, match="batch sampled ahead"):
        overlap.decode({"step": 7})
