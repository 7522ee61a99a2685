"""The WMRL training loop: rollout → world model → anchors → correction → GRPO update.

    summary = train_and_evaluate(config, workdir)

One step, as in DESIGN.md section 3:

1. sample `tasks_per_step` train tasks (a pure function of the seed and the
   step, so the task iterator's position is the step);
2. the agent samples G programs per task;
3. anchor groups (a fraction ρ, at least one; every group for `real`, none
   for `wm_naive`) go to the executor at once, and the world-model pass over
   all groups runs while they execute;
4. outcomes come back: timeouts and crashes are rewards; infrastructure
   errors are retried, then handled as `executor.on_infra_error` says;
   non-finite rewards are rejected and counted;
5. the reward correction (Online Debiasing, IVD) turns predictions and anchor
   scores into the rewards fed to GRPO; group advantages; the sharded train
   step updates the policy;
6. the ledger, metrics, checkpoints and (every `eval_every` steps) a held-out
   evaluation: greedy programs on held-out tasks, executed for real.

Executions made for held-out evaluation are measurement, not training cost:
they are logged (`eval/*`) but not charged to the ledger, so every arm pays
the same for them and compute-to-target compares training cost alone.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from wmrl_jax.core import grpo
from wmrl_jax.envs.task import Task
from wmrl_jax.train import components
from wmrl_jax.train import step as step_lib
from wmrl_jax.train.agent import Agent, Rollout, WMOutput
from wmrl_jax.train.checkpoint import Checkpointer
from wmrl_jax.train.ledger import Ledger
from wmrl_jax.train.metrics import MetricWriter

log = logging.getLogger(__name__)

# Config keys a resumed run may change: how long it trains, how often it evaluates,
# which checkpoints it keeps. A change to any other key makes it another run.
RESUMABLE_KEYS = ("num_steps", "eval_every", "checkpoint")


def resume_mismatch(saved: dict, current: dict, prefix: str = "") -> list[str]:
    """Dotted config keys whose values differ between two config dicts, outside
    `RESUMABLE_KEYS` (top level only), sorted."""
    out = []
    for k in sorted(set(saved) | set(current)):
        if not prefix and k in RESUMABLE_KEYS:
            continue
        a, b = saved.get(k, "<absent>"), current.get(k, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            out += resume_mismatch(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k}")
    return out


def step_tasks(tasks: Sequence[Task], *, seed: int, step: int, count: int) -> list[Task]:
    """The tasks of one step, a pure function of (seed, step).

    Without replacement when `count <= len(tasks)`; otherwise every task
    appears `count // len(tasks)` or one more times (one group each).
    """
    rng = np.random.default_rng([seed, step])
    reps = -(-count // len(tasks))
    idx = np.concatenate([rng.permutation(len(tasks)) for _ in range(reps)])[:count]
    return [tasks[i] for i in sorted(idx)]


def choose_anchor_groups(
    key, *, arm: str, num_groups: int, fraction: float, policy: str, group_var=None
) -> np.ndarray:
    """Which groups are executed for real: bool of shape [num_groups].

    `real` executes every group and `wm_naive` none. Otherwise
    `max(1, round(fraction * num_groups))` groups: uniformly at random, or
    with policy "uncertain" those whose mean WM variance (`group_var`, of shape
    [num_groups]) is largest.
    """
    if arm == "real":
        return np.ones(num_groups, bool)
    if arm == "wm_naive":
        return np.zeros(num_groups, bool)
    k = min(num_groups, max(1, int(round(fraction * num_groups))))
    if policy == "uncertain" and group_var is not None:
        order = np.argsort(-np.nan_to_num(np.asarray(group_var), nan=np.inf), kind="stable")
    else:
        order = np.asarray(jax.random.permutation(key, num_groups))
    mask = np.zeros(num_groups, bool)
    mask[order[:k]] = True
    return mask


class Outcomes:
    """Runs a step's anchors: submit, retry infrastructure errors, reject bad rewards."""

    def __init__(self, source, *, retries: int, on_infra_error: str):
        self.source, self.retries, self.on_infra_error = source, retries, on_infra_error

    def submit(self, tasks: Sequence[Task], programs: Sequence[str], rows: Sequence[int], g: int):
        return {i: self.source.submit(tasks[i // g], programs[i]) for i in rows}

    def collect(self, futures, tasks, programs, g: int) -> tuple[dict, dict]:
        """Waits for `futures`; returns `({row: Outcome}, counts)`; dropped rows are absent."""
        done, counts = {}, {"infra_errors": 0, "dropped": 0, "nonfinite": 0}
        for i, fut in futures.items():
            out = fut.result()
            for _ in range(self.retries):
                if out.status != "infra_error":
                    break
                counts["infra_errors"] += 1
                out = self.source.submit(tasks[i // g], programs[i]).result()
            if out.status == "infra_error":
                counts["infra_errors"] += 1
                if self.on_infra_error == "raise":
                    raise RuntimeError(
                        f"sandbox infrastructure error, retries spent: {out.message}"
                    )
                counts["dropped"] += 1
                continue
            if not np.isfinite(out.reward):
                counts["nonfinite"] += 1
                continue
            done[i] = out
        if counts["dropped"]:
            log.warning(
                "%d anchor executions failed for infrastructure reasons after %d retries; "
                "those samples fall back to world-model rewards this step",
                counts["dropped"],
                self.retries,
            )
        if counts["nonfinite"]:
            log.warning("%d non-finite rewards rejected this step", counts["nonfinite"])
        return done, counts


def evaluate(
    agent: Agent, params, tasks: Sequence[Task], source, *, samples: int = 0, key=None
) -> dict[str, float]:
    """Held-out programs executed for real: mean leaderboard percentile (invalid counts 0).

    With `samples == 0`, one greedy program per task; otherwise `samples`
    programs per task from the policy (the expected percentile, a smoother
    measure than greedy's single pick; use the same `key` at every evaluation).
    """
    if samples > 0:
        rollout = agent.rollout(params, tasks, group_size=samples, key=key)
        programs, owners = rollout.programs, [t for t in tasks for _ in range(samples)]
    else:
        programs, owners = agent.greedy_programs(params, tasks), list(tasks)
    futures = [source.submit(t, p) for t, p in zip(owners, programs, strict=True)]
    outs = [f.result() for f in futures]
    pct = np.array([o.percentile if o.status == "ok" and np.isfinite(o.percentile) else 0.0
                    for o in outs]).reshape(len(tasks), -1)  # fmt: skip
    result = {
        "eval/heldout_percentile": float(pct.mean()),
        "eval/valid_fraction": float(np.mean([o.status == "ok" for o in outs])),
        "eval/exec_seconds": float(sum(o.seconds for o in outs)),
    }
    per_task = pct.mean(axis=1)
    result.update(
        {f"eval/percentile/{t.id}": float(p) for t, p in zip(tasks, per_task, strict=True)}
    )
    return result


def _group_rank_corr(a: np.ndarray, b: np.ndarray, g: int) -> float:
    """Mean over groups of the Spearman correlation of a and b within each group."""
    from scipy.stats import spearmanr

    out = []
    for x, y in zip(a.reshape(-1, g), b.reshape(-1, g), strict=True):
        ok = np.isfinite(x) & np.isfinite(y)
        if ok.sum() > 2 and np.ptp(x[ok]) > 0 and np.ptp(y[ok]) > 0:
            out.append(spearmanr(x[ok], y[ok])[0])
    return float(np.mean(out)) if out else float("nan")


def oracle_metrics(rewards, valid, truth, wm_mean, g: int) -> dict[str, float]:
    """How far the fed rewards (and the raw WM) are from every sample's true reward."""
    err = rewards - truth
    m = {
        "oracle/true_reward": float(np.mean(truth)),
        "oracle/fed_bias": float(np.mean(err[valid])) if valid.any() else np.nan,
        "oracle/fed_error_var": float(np.var(err[valid])) if valid.any() else np.nan,
        "oracle/fed_group_rank_corr": _group_rank_corr(np.where(valid, rewards, np.nan), truth, g),
    }
    if wm_mean is not None and np.isfinite(wm_mean).any():
        m["oracle/wm_bias"] = float(np.nanmean(wm_mean - truth))
        m["oracle/wm_group_rank_corr"] = _group_rank_corr(wm_mean, truth, g)
    return m


def _advantages(rewards: np.ndarray, valid: np.ndarray, g: int, mode: str) -> np.ndarray:
    adv = jax.vmap(lambda r, m: grpo.group_advantages(r, mode=mode, mask=m))(
        jnp.asarray(rewards.reshape(-1, g)), jnp.asarray(valid.reshape(-1, g))
    )
    return np.asarray(adv, np.float32).reshape(-1)


class Trainer:
    """Holds the parts of one run; `run()` trains, evaluates and checkpoints.

    Args:
      config: a training config (see `experiments/configs/tiny_cpu.py`).
      workdir: checkpoints, metrics and plots go here.
      outcomes: optional outcome source overriding `config.executor` (tests, studies).
      prebuilt: optional `(agent, params, info)` from `components.make_recipe_agent`,
        so a study warm-starts once per seed and starts every arm from the same policy.
    """

    def __init__(
        self, config: ml_collections.ConfigDict, workdir: str, *, outcomes=None, prebuilt=None
    ):
        components.validate_config(config)
        self.config, self.workdir = config, workdir
        os.makedirs(workdir, exist_ok=True)
        self.tasks = components.load_tasks(config)
        key = jax.random.key(config.seed)
        self.key, model_key = jax.random.split(key)
        self.table = None
        if prebuilt is not None:
            self.agent, params, self.info = prebuilt
        elif config.agent.kind == "recipe":
            self.table = components.load_table(config)
            self.agent, params, self.info = components.make_recipe_agent(
                config, self.tasks, self.table, model_key
            )
        else:
            self.agent, params, self.info = components.make_text_agent(config)
        if outcomes is None:
            outcomes, env = components.make_outcomes(config, table=self.table)
        else:
            env = type(outcomes).__name__
        self.environment = env
        self.source = outcomes
        # Replay sources name what decides their answers (the table); sandboxes execute.
        self.fingerprint = getattr(outcomes, "fingerprint", None)
        self.outcomes = Outcomes(
            outcomes, retries=config.executor.infra_retries,
            on_infra_error=config.executor.on_infra_error,
        )  # fmt: skip
        self.correction = components.make_correction(config)
        self.optimizer = step_lib.make_optimizer(components.optimizer_config(config))
        self.mesh = step_lib.make_mesh_from_config(config.mesh)
        self.train_step = step_lib.make_train_step(
            self.info["graphdef"], self.optimizer, config.train, self.mesh
        )
        # A copy: the state is donated to the train step, the run's key is not.
        key_data = jnp.array(jax.random.key_data(self.key), copy=True)
        extra = {"correction": self.correction.init(), "key": key_data}
        # Distinct buffers per leaf: the state is donated, and init may share constants.
        extra = jax.tree.map(lambda x: jnp.array(x, copy=True), extra)
        state = step_lib.init_train_state(
            params, self.optimizer, kl_coef=config.train.loss.kl_coef, extra=extra
        )
        self.state = step_lib.shard_state(state, self.mesh)
        self.ledger = Ledger()
        self.history: list[dict] = []
        self.last_metrics: dict[str, float] = {}
        self.step_log: list[dict] = []  # This process's steps (not restored on resume).
        self.checkpointer = Checkpointer(
            os.path.join(workdir, "checkpoints"),
            keep=config.checkpoint.keep,
            best_metric="eval/heldout_percentile",
            best_mode="max",
        )
        self.start_step = self._maybe_restore()
        # "initial": the world model is the warm-started backbone, frozen; "current": the
        # policy's own params (the same weights answer both prompts, and drift with RL).
        self.wm_params = (
            jax.tree.map(lambda x: jnp.array(x, copy=True), params)
            if config.agent.wm_params == "initial"
            else None
        )
        self._correct = jax.jit(self.correction.update)

    def _evaluate(self) -> dict[str, float]:
        key = jax.random.fold_in(self.key, -1 % 2**31)  # The same draws at every evaluation.
        return evaluate(
            self.agent, self.state.params, self.tasks.heldout, self.source,
            samples=self.config.eval_samples, key=key,
        )  # fmt: skip

    def _wm(self, params):
        return params if self.wm_params is None else self.wm_params

    # -- checkpoints -------------------------------------------------------
    def _maybe_restore(self) -> int:
        if self.checkpointer.latest_step() is None:
            return 0
        abstract = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
            if isinstance(x, jax.Array) else x,
            self.state,
        )  # fmt: skip
        self._check_resumable(self.checkpointer.meta())  # Before reading any state.
        self.state, meta = self.checkpointer.restore(abstract_state=abstract)
        self.ledger = Ledger.from_dict(meta["ledger"])
        self.history = list(meta.get("history", []))
        step = int(meta["step"])
        log.info("resumed from step %d (%s)", step, self.checkpointer.directory)
        return step

    def _check_resumable(self, meta: dict) -> None:
        """Raises ValueError when the checkpoints were made by another run: another
        config (outside `RESUMABLE_KEYS`) or another outcome source (a rebuilt table)."""
        why = []
        if "config" in meta:
            saved, current = (
                json.loads(c) for c in (meta["config"], self.config.to_json_best_effort())
            )
            why += [f"config {k}" for k in resume_mismatch(saved, current)]
        if meta.get("outcomes_fingerprint") != self.fingerprint:
            why.append(f"outcome source ({meta.get('outcomes_fingerprint')} != {self.fingerprint})")
        if why:
            raise ValueError(
                f"{self.checkpointer.directory} holds checkpoints of another run "
                f"({'; '.join(why)}): resume with the same config and outcome source, "
                "or start in a fresh workdir"
            )

    def _save(self, step: int, metrics: dict, *, force: bool = False) -> None:
        meta = {
            "step": step,
            "ledger": self.ledger.to_dict(),
            "history": self.history,
            "task_iterator": {"seed": int(self.config.seed), "next_step": step},
            "config": self.config.to_json_best_effort(),
            "outcomes_fingerprint": self.fingerprint,
        }
        self.checkpointer.save(step, self.state, meta, metrics=metrics, force=force)

    # -- one step ----------------------------------------------------------
    def _step(self, step: int) -> dict[str, float]:
        c = self.config
        g = c.group_size
        key = jax.random.fold_in(self.key, step)
        k_roll, k_anchor, k_wm, k_train = jax.random.split(key, 4)
        tasks = step_tasks(self.tasks.train, seed=c.seed, step=step, count=c.tasks_per_step)
        params = self.state.params

        t0 = time.perf_counter()
        rollout: Rollout = self.agent.rollout(params, tasks, group_size=g, key=k_roll)
        gen_seconds = time.perf_counter() - t0
        n = len(rollout.programs)
        num_groups = n // g

        use_wm = c.arm != "real"
        wm: WMOutput | None = None
        wm_seconds = 0.0
        if c.anchor_policy == "uncertain" and use_wm:
            t0 = time.perf_counter()
            wm = self.agent.predict(self._wm(params), tasks, rollout, key=k_wm)
            wm_seconds = time.perf_counter() - t0
        group_var = None if wm is None else np.nanmean(wm.var.reshape(-1, g), axis=1)
        groups = choose_anchor_groups(
            k_anchor, arm=c.arm, num_groups=num_groups, fraction=c.anchor_fraction,
            policy=c.anchor_policy, group_var=group_var,
        )  # fmt: skip
        rows = np.flatnonzero(np.repeat(groups, g))
        futures = self.outcomes.submit(tasks, rollout.programs, rows, g)
        if use_wm and wm is None:  # Runs while the anchors execute.
            t0 = time.perf_counter()
            wm = self.agent.predict(self._wm(params), tasks, rollout, key=k_wm)
            wm_seconds = time.perf_counter() - t0
        done, counts = self.outcomes.collect(futures, tasks, rollout.programs, g)
        observe = getattr(self.agent, "observe", None)
        if observe is not None:  # In-context anchors for later world-model prompts.
            for i, out in done.items():
                observe(tasks[i // g], rollout.programs[i], out)

        real = np.full(n, np.nan, np.float32)
        executed = np.zeros(n, bool)
        for i, out in done.items():
            real[i], executed[i] = out.reward, True
        exec_seconds = float(sum(o.seconds for o in done.values()))
        n_exec = len(done) + counts["dropped"]

        metrics: dict[str, float] = {}
        if use_wm:
            rewards, corr_state, diag = self._correct(
                self.state.extra["correction"], wm.mean, wm.var, real, executed
            )
            rewards = np.asarray(rewards, np.float32)
            self.state = self.state.replace(extra={**self.state.extra, "correction": corr_state})
            metrics.update({f"correction/{k}": float(v) for k, v in diag.items()})
            metrics["wm/parse_failures"] = float(wm.parse_failures)
            if wm.parse_failures == n:
                log.warning(
                    "step %d: the world model produced no usable prediction; rewards come "
                    "from anchors only (the correction's fallback elsewhere)",
                    step,
                )
            valid = np.ones(n, bool)
        else:
            rewards = np.where(executed, real, 0.0).astype(np.float32)
            valid = executed
        advantages = _advantages(rewards, valid, g, c.advantage)
        batch = dict(rollout.batch, advantages=advantages)
        if c.train.loss.aux_coef:  # The backbone keeps learning outcomes from executions.
            batch.update(self.agent.aux_batch(tasks, rollout, real, executed))
        t0 = time.perf_counter()
        self.state, train_metrics = self.train_step(self.state, batch, k_train)
        train_metrics = {f"train/{k}": float(v) for k, v in jax.device_get(train_metrics).items()}
        train_seconds = time.perf_counter() - t0

        self.ledger = self.ledger.add(
            Ledger(
                gen_tokens=rollout.gen_tokens, gen_seconds=gen_seconds,
                wm_tokens=0 if wm is None else wm.wm_tokens, wm_seconds=wm_seconds,
                executions=n_exec, exec_seconds=exec_seconds, train_seconds=train_seconds,
            )
        )  # fmt: skip
        metrics.update(train_metrics)
        metrics.update({f"ledger/{k}": float(v) for k, v in self.ledger.to_dict().items()})
        metrics["ledger/compute_seconds"] = float(self.ledger.compute_seconds)
        metrics.update({f"anchors/{k}": float(v) for k, v in counts.items()})
        metrics["reward/fed_mean"] = float(np.mean(rewards[valid])) if valid.any() else np.nan
        metrics["reward/real_mean"] = float(np.nanmean(real)) if executed.any() else np.nan
        metrics["anchors/groups"] = float(groups.sum())
        if wm is not None:
            ok = np.isfinite(wm.mean)
            metrics["wm/pred_mean"] = float(np.mean(wm.mean[ok])) if ok.any() else np.nan
            both = executed & ok
            if both.any():
                metrics["wm/raw_bias_on_anchors"] = float(np.mean(wm.mean[both] - real[both]))
        oracle = getattr(self.source, "lookup", None)
        if oracle is not None:  # Replay knows every sample's true reward, for free.
            truth = np.array(
                [oracle(tasks[i // g], p).reward for i, p in enumerate(rollout.programs)]
            )
            metrics.update(
                oracle_metrics(rewards, valid, truth, None if wm is None else wm.mean, g)
            )
        return metrics

    def run(self, *, until: int | None = None) -> dict:
        """Trains from the current step to `config.num_steps`; returns the summary.

        Args:
          until: stop after this step (checkpointing it), as a preempted job would;
            a later `run()` on the same workdir resumes.
        """
        c = self.config
        last = c.num_steps if until is None else min(until, c.num_steps)
        writer = MetricWriter(
            self.workdir,
            progress_total=c.num_steps,
            resume_step=self.start_step or None,
            # No checkpoint yet: whatever an earlier, unfinished run logged is stale.
            overwrite=self.start_step == 0,
        )
        try:
            if self.start_step == 0:
                ev = self._evaluate()
                self.history.append({"step": 0, **self.ledger.to_dict(), **ev})
                writer.write(0, ev)
            for step in range(self.start_step + 1, last + 1):
                metrics = self._step(step)
                self.last_metrics = metrics
                self.step_log.append({"step": step, **metrics})
                if step % c.eval_every == 0 or step == c.num_steps:
                    ev = self._evaluate()
                    metrics.update(ev)
                    self.history.append({"step": step, **self.ledger.to_dict(), **ev})
                writer.write(step, metrics)
                writer.progress(
                    step, reward=metrics.get("reward/fed_mean", np.nan),
                    compute_seconds=self.ledger.compute_seconds,
                )  # fmt: skip
                if step % c.checkpoint.every == 0 or step == last:
                    best = {"eval/heldout_percentile": metrics["eval/heldout_percentile"]} \
                        if "eval/heldout_percentile" in metrics else None  # fmt: skip
                    self._save(step, best, force=step == last)
            self.checkpointer.wait()
            if c.checkpoint.export_hf and last == c.num_steps:
                self.export_policy(os.path.join(self.workdir, "policy_hf"))
        finally:
            writer.close()
        return self.summary()

    def export_policy(self, out_dir: str) -> str:
        """Writes the current policy as a Hugging Face directory (config.json + safetensors,
        and the tokenizer when the agent has one)."""
        from wmrl_jax.train.checkpoint import export_hf

        return export_hf(
            self.info["graphdef"],
            self.state.params,
            self.info["raw_config"],
            out_dir,
            tokenizer=getattr(self.agent, "tokenizer", None),
            overwrite=True,
        )

    def summary(self) -> dict:
        """Held-out percentile before and after, the ledger, the last calibration."""
        first, last = self.history[0], self.history[-1]
        return {
            "arm": self.config.arm,
            "environment": self.environment,
            "heldout_before": first["eval/heldout_percentile"],
            "heldout_after": last["eval/heldout_percentile"],
            "ledger": self.ledger.to_dict(),
            "compute_seconds": self.ledger.compute_seconds,
            "calibration": {
                k: v for k, v in self.last_metrics.items() if k.startswith("correction/")
            },
            "history": self.history,
            "steps": self.step_log,
        }

    def close(self) -> None:
        self.checkpointer.close()
        close = getattr(self.source, "close", None)
        if close is not None:
            close()


def train_and_evaluate(
    config: ml_collections.ConfigDict, workdir: str, *, outcomes=None, prebuilt=None
) -> dict:
    """Builds a `Trainer`, runs it to `config.num_steps` (resuming if possible)."""
    trainer = Trainer(config, workdir, outcomes=outcomes, prebuilt=prebuilt)
    try:
        return trainer.run()
    finally:
        trainer.close()
