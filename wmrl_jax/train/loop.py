"""The WMRL trainer: rollout → world model → anchors → execution → correction → GRPO update.

    summary = train_and_evaluate(config, workdir)

One step (`Trainer._step`), each stage returning its own record
(`wmrl_jax.train.records`), composed into the step's `StepRecord`:

1. `tasks_per_step` train tasks, a pure function of the seed and the step (so
   the task iterator's position is the step); the agent samples G programs per
   task (`records.Sampled`);
2. the arm (`wmrl_jax.core.arms`, `wmrl_jax.train.rewards`) chooses the groups
   executed — all, the anchors (a fraction ρ, at least one) or none
   (`records.Anchors`) — and they go to the outcome source at once; the
   world-model pass (`world_models.Predictor`) runs while they execute. A sample
   without a program (`Rollout.causes`) is an invalid outcome known without
   running anything: never executed nor shown to the world model, charged
   nothing, fed the invalid floor in every arm;
3. outcomes come back (`records.Execution`): timeouts and crashes are rewards;
   infrastructure errors are retried, then handled as `executor.on_infra_error`
   says; non-finite rewards are rejected and counted;
4. the reward correction (Online Debiasing, IVD) turns predictions and anchor
   scores into the rewards fed to GRPO (`records.Fed`); rows without a usable
   reward are masked out; the sharded train step (`wmrl_jax.train.step`)
   updates the policy;
5. the ledger (`progress.Progress`), metrics, step hooks, checkpoints and (every
   `eval_every` steps, or on the compute budget's grid: `evaluation.EvalSchedule`)
   a held-out evaluation (`wmrl_jax.train.evaluation`).

A run resumes from its workdir's latest checkpoint, once the resume guard
(`wmrl_jax.train.resume`) has checked that the checkpoints are its own.

With `config.overlap`, step t + 1's batch is sampled while step t's programs
execute, from the params before update t: one update stale, which the loss's
importance ratio corrects (`wmrl_jax.train.overlap`).

Across processes (`config.distributed`, or a launcher's environment) every
process runs this same loop on one mesh spanning all of them, with the same
batch; anchors and evaluations are executed by process 0 and their outcomes
sent to the others, the ledger's seconds are process 0's, files are written by
process 0 and checkpoints by all together (`wmrl_jax.train.multihost`).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import ml_collections

from wmrl_jax import agents
from wmrl_jax.train import arms, builder, cost, distributed, multihost, overlap, resume, stages
from wmrl_jax.train import mesh as mesh_lib
from wmrl_jax.train import state as state_lib
from wmrl_jax.train import step as step_lib
from wmrl_jax.train.checkpoint import Checkpointer, export_hf
from wmrl_jax.train.config import validate_config
from wmrl_jax.train.console import Console
from wmrl_jax.train.evaluation import EvalSchedule
from wmrl_jax.train.execution import Executions
from wmrl_jax.train.ledger import LedgerStep, Timer
from wmrl_jax.train.lock import WorkdirLock
from wmrl_jax.train.progress import Progress
from wmrl_jax.train.records import Execution, Sampled, StepRecord
from wmrl_jax.train.rewards import Rewarder
from wmrl_jax.train.sections import AgentSection, ExecutorSection
from wmrl_jax.train.world_models import Predictor
from wmrl_jax.train.writer import MetricWriter

log = logging.getLogger(__name__)

StepHook = Callable[[StepRecord], Mapping[str, float]]


class Trainer:
    """Holds the parts of one run; `run()` trains, evaluates and checkpoints.

    Args:
      config: a training config (`wmrl_jax.train.config.base_config`).
      workdir: checkpoints, metrics and plots go here.
      outcomes: optional outcome source overriding `config.executor` (tests, studies).
      prebuilt: optional `agents.Built` (e.g. from `builder.build_agent`), so a study
        warm-starts once per seed and starts every arm from the same policy.
      hooks: step hooks: called with each finished `StepRecord`; their scalars
        join the step's metrics (the studies' oracle metrics).
      console: print one line per step (and the evaluations) to stdout.
    """

    def __init__(
        self,
        config: ml_collections.ConfigDict,
        workdir: str,
        *,
        outcomes=None,
        prebuilt: agents.Built | None = None,
        hooks: Sequence[StepHook] = (),
        console: bool = False,
    ):
        validate_config(config)
        multihost.join(config)  # Several processes: all of them, from here on.
        mesh_lib.check_mesh(config.mesh, jax.devices())  # a ConfigError before any work
        builder.check_workdir(workdir)
        # One trainer per workdir (process 0 writes its files), until `close`.
        self._lock = WorkdirLock.acquire(workdir) if distributed.is_primary() else None
        try:
            self._build(config, workdir, outcomes=outcomes, prebuilt=prebuilt, hooks=hooks,
                        console=console)  # fmt: skip
        except BaseException:  # A failed build (or a signal) still closes what it opened.
            self.close()
            raise

    def _build(self, config, workdir, *, outcomes, prebuilt, hooks, console) -> None:
        primary = distributed.is_primary()
        self.config, self.workdir = config, workdir
        self.arm = arms.get(config.arm)
        self.hooks = tuple(hooks)
        self.console = Console(enabled=console and primary)
        agent, executor = AgentSection.of(config), ExecutorSection.of(config)
        if config.tasks.source == "builtin":
            self.console.note("tasks: the built-in suite (built once per version, a few minutes)")
        with multihost.primary_first("tasks"):  # A suite built once, then read.
            self.tasks = builder.load_tasks(config)
        self.key, model_key = jax.random.split(jax.random.key(config.seed))
        mesh = step_lib.make_mesh_from_config(config.mesh)
        multihost.check_mesh(mesh)
        batch_sizes = None
        if prebuilt is None:
            self.console.note(f"agent: {agent.kind} (with its warm start, if any)")
            batch_sizes = self._memory_plan(config, agent, mesh)
        self.built = prebuilt or builder.build_agent(
            config, self.tasks, model_key, mesh=mesh, batch_sizes=batch_sizes
        )
        self.agent = self.built.agent
        environment = ""
        if outcomes is None and primary:  # Only process 0 executes (`multihost`).
            self.console.note(f"outcomes: executor {executor.kind}")
            # The tasks' grader side is part of the source's fingerprint: a resume after
            # an edit of answers or boards is refused by the resume guard.
            tasks = [*self.tasks.train, *self.tasks.heldout, *self.tasks.pretrain]
            outcomes, environment = builder.make_outcomes(config, tasks=tasks)
        self.executions = Executions(
            multihost.SharedOutcomes(outcomes, environment=environment), executor,
            seed=config.seed,
        )  # fmt: skip
        self.rewarder = Rewarder.from_config(
            config, self.arm, builder.make_correction(config),
            remembered=self.executions.runner.remembered,
        )  # fmt: skip
        optimizer = step_lib.make_optimizer(builder.optimizer_config(config))
        self.train_step = step_lib.make_train_step(
            self.built.graphdef, optimizer, config.train, mesh
        )
        self.state = self._init_state(self.built.params, optimizer, mesh)
        # Device-seconds are charged on accelerators only: wall seconds x the mesh's chips.
        accelerators = 0 if jax.default_backend() == "cpu" else int(mesh.devices.size)
        self.progress = Progress(accelerators, cost.from_config(config))
        self.checkpointer = Checkpointer(
            os.path.join(workdir, "checkpoints"), keep=config.checkpoint.keep,
            best_metric="eval/heldout_percentile", best_mode="max",
        )  # fmt: skip
        self._ahead: overlap.Ahead | None = None  # The next step's batch (`config.overlap`).
        self.start_step = self._maybe_restore()
        self.world_model = Predictor.of(config, self.agent, self.built.params)

    def _memory_plan(self, config, agent: AgentSection, mesh) -> dict[str, int] | None:
        """Generation batch sizes from the memory plan (LLM agents); problems as notes."""
        if not agents.capabilities(agent.kind).memory_plan:
            return None
        plan = mesh_lib.plan_run(config, devices=list(mesh.devices.flat), unsharded_load=False)
        for problem in plan.problems:
            self.console.note(f"memory plan: {problem}")
        return plan.batch_sizes()

    def _init_state(self, params, optimizer, mesh):
        # A copy: the state is donated to the train step, the run's key is not.
        key_data = jnp.array(jax.random.key_data(self.key), copy=True)
        extra = {**self.rewarder.init(), "key": key_data}
        # Distinct buffers per leaf: the state is donated, and init may share constants.
        extra = jax.tree.map(lambda x: jnp.array(x, copy=True), extra)
        state = step_lib.init_train_state(
            params, optimizer, kl_coef=self.config.train.loss.kl_coef, extra=extra
        )
        return step_lib.shard_state(state, mesh)

    @property
    def fingerprint(self) -> str | None:
        """What decides the outcome source's answers (a replay table's digest), or None."""
        return self.executions.source.fingerprint

    @property
    def environment(self) -> str:
        """Where programs run, in a word for the logs ("docker", "local", "replay", ...)."""
        return self.executions.source.environment

    def _evaluate(self) -> dict[str, float]:
        key = jax.random.fold_in(self.key, -1 % 2**31)  # The same draws at every evaluation.
        return self.executions.evaluate(
            self.agent, self.state.params, self.tasks.heldout, samples=self.config.eval_samples,
            key=key,
        )  # fmt: skip

    # -- checkpoints -------------------------------------------------------
    def _maybe_restore(self) -> int:
        restored = resume.restore(
            self.checkpointer, self.state, self.config, fingerprint=self.fingerprint
        )
        if restored is None:
            return 0
        self.state, meta = restored
        self.progress.restore(meta)
        self.executions.runner.restore_cache(meta.get("execution_cache", []))
        self._ahead = overlap.decode(meta["ahead"]) if "ahead" in meta else None
        step = int(meta["step"])
        log.info("resumed from step %d (%s)", step, self.checkpointer.directory)
        return step

    def _save(self, step: int, metrics: dict, *, force: bool = False) -> None:
        meta = {
            "step": step,
            **self.progress.to_meta(),
            "task_iterator": {"seed": int(self.config.seed), "next_step": step},
            "config": self.config.to_json_best_effort(),
            "outcomes_fingerprint": self.fingerprint,
            "execution_cache": self.executions.runner.cache_state(),
        }
        if self._ahead is not None:  # The next step trains on it: it travels with the state.
            meta["ahead"] = overlap.encode(self._ahead)
        view = state_lib.checkpoint_view(self.state)
        self.checkpointer.save(step, view, meta, metrics=metrics, force=force)

    # -- one step, stage by stage --------------------------------------------
    def _step(self, step: int) -> dict[str, float]:
        c, extra = self.config, self.state.extra
        k_roll, k_anchor, k_wm, k_train = self._step_keys(step)
        tasks = self._step_tasks(step, k_anchor)
        timing = LedgerStep()
        rollout, stale = self._rollout(step, tasks, k_roll, timing)
        sampled = Sampled(step, tuple(tasks), c.group_size, rollout, stale)
        wm = None
        if self.arm.world_model and self.rewarder.anchor_policy != "random":
            wm = self._predict(sampled, k_wm, timing)  # The choice needs the predictions.
        anchors = self.rewarder.choose_anchors(sampled, wm, extra, k_anchor)
        pending = self.executions.submit(sampled, anchors)
        if self.arm.world_model and wm is None:
            wm = self._predict(sampled, k_wm, timing)  # Runs while the anchors execute.
        if c.overlap and step < c.num_steps and overlap.executing(pending):
            self._sample_ahead(step + 1)  # So does the next step's batch.
        execution = self._collect(sampled, pending, timing)
        fed, extra = self.rewarder.correct(sampled, wm, anchors, execution, extra)
        self.state = self.state.replace(extra=extra)
        metrics = self._update(sampled, execution, fed, k_train, timing)
        ledger, ledger_metrics = self.progress.add_step(timing.ledger())
        record = StepRecord(sampled, wm, anchors, execution, fed, ledger)
        metrics.update(stages.step_metrics(record, self.arm))
        if c.overlap:  # 1: this step trained on a batch sampled before the last update.
            metrics["overlap/stale"] = float(stale)
        metrics.update(ledger_metrics)
        for hook in self.hooks:
            metrics.update(hook(record))
        return metrics

    def _step_keys(self, step: int) -> jax.Array:
        """The step's (rollout, anchor, world-model, train) keys, of shape [4]."""
        return jax.random.split(jax.random.fold_in(self.key, step), 4)

    def _step_tasks(self, step: int, k_anchor) -> list:
        """The step's tasks: a pure function of the seed and the step (and the anchor key)."""
        c = self.config
        tasks = stages.step_tasks(self.tasks.train, seed=c.seed, step=step, count=c.tasks_per_step)
        sampled = self.rewarder.sampled_groups(len(tasks), k_anchor)
        return [t for t, keep in zip(tasks, sampled, strict=True) if keep]

    def _rollout(self, step: int, tasks, key, timing: LedgerStep):
        """`(rollout, stale)`: the batch sampled ahead for this step (stale), else a fresh one."""
        ahead, self._ahead = self._ahead, None
        rollout = overlap.claim(ahead, step, tasks, timing)
        if rollout is not None:
            return rollout, True
        with Timer() as timer:
            rollout = self.agent.rollout(
                self.state.params, tasks, group_size=self.config.group_size, key=key
            )
        stages.charge_rollout(timing, rollout, timer.seconds)
        return rollout, False

    def _sample_ahead(self, step: int) -> None:
        """Samples `step`'s batch now, during the step before (`config.overlap`)."""
        k_roll, k_anchor, _, _ = self._step_keys(step)
        tasks = self._step_tasks(step, k_anchor)
        self._ahead = overlap.sample_ahead(
            self.agent, self.state.params, tasks, step=step, group_size=self.config.group_size,
            key=k_roll,
        )  # fmt: skip

    def _predict(self, sampled: Sampled, key, timing: LedgerStep):
        return self.world_model.predict(self.state.params, sampled, key, timing)

    def _collect(self, sampled: Sampled, pending: dict, timing: LedgerStep) -> Execution:
        execution = self.executions.collect(sampled, pending, timing)
        g, programs = sampled.group_size, sampled.rollout.programs
        for i, out in execution.results.items():  # In-context anchors for later WM prompts.
            self.agent.observe(sampled.tasks[i // g], programs[i], out)
        return execution

    def _update(self, sampled: Sampled, execution: Execution, fed, key, timing: LedgerStep):
        """The update stage: the train step on the fed rewards; returns its metrics."""
        c = self.config
        aux = self.agent.aux_batch if c.train.loss.aux_coef else None
        batch = stages.update_batch(
            sampled, execution, fed, advantage=c.advantage, epochs=c.train.num_epochs,
            aux_batch=aux, timing=timing,
        )  # fmt: skip
        if jax.process_count() > 1:  # The same batch everywhere: each process gives its rows.
            batch = multihost.place_batch(batch, self.train_step)
        with timing.timed("train_seconds"):
            self.state, train_metrics = self.train_step(self.state, batch, key)
            train_metrics = jax.device_get(train_metrics)
        return {f"train/{k}": float(v) for k, v in train_metrics.items()}

    # -- the run -----------------------------------------------------------
    def run(self, *, until: int | None = None) -> dict:
        """Trains from the current step to `config.num_steps`; returns the summary.

        Args:
          until: stop after this step (checkpointing it), as a preempted job would;
            a later `run()` on the same workdir resumes.
        """
        c, progress = self.config, self.progress
        last = c.num_steps if until is None else min(until, c.num_steps)
        schedule = EvalSchedule(c)
        primary = distributed.is_primary()
        writer = MetricWriter(  # Files of process 0 only (elsewhere it writes nothing).
            self.workdir,
            tensorboard=primary,
            jsonl=primary,
            resume_step=self.start_step or None,
            # No checkpoint yet: whatever an earlier, unfinished run logged is stale.
            overwrite=self.start_step == 0,
        )
        self.console.start(self.start_step, c.num_steps, arm=c.arm, environment=self.environment)
        try:
            if self.start_step == 0:
                ev = self._evaluate()
                progress.log_evaluation(0, ev)
                writer.write(0, ev)
                self.console.evaluation(0, ev)
            step = self.start_step
            while step < last and not schedule.spent(progress.ledger):
                step += 1
                metrics = self._step(step)
                progress.log_step(step, metrics)
                final = step == c.num_steps or schedule.spent(progress.ledger)
                if final or schedule.due(step, progress.ledger, progress.history):
                    ev = self._evaluate()
                    metrics.update(ev)
                    progress.log_evaluation(step, ev)
                writer.write(step, metrics)
                self.console.step(step, metrics)
                if step % c.checkpoint.every == 0 or step == last or final:
                    # An evaluation without a usable execution (NaN) never ranks as best.
                    pct = metrics.get("eval/heldout_percentile", math.nan)
                    best = {"eval/heldout_percentile": pct} if math.isfinite(pct) else None
                    self._save(step, best, force=step == last or final)
            self.checkpointer.wait()
            if c.checkpoint.export_hf and (step == c.num_steps or schedule.spent(progress.ledger)):
                self.export_policy(os.path.join(self.workdir, "policy_hf"))
        finally:
            writer.close()
        return self.summary()

    def export_policy(self, out_dir: str) -> str:
        """Writes the current policy as a Hugging Face directory (config.json + safetensors,
        and the tokenizer when the agent has one); process 0 writes, all gather."""
        params = multihost.gather(self.state.params)
        if not distributed.is_primary():
            return out_dir
        return export_hf(
            self.built.graphdef, params, self.built.raw_config, out_dir,
            tokenizer=self.agent.tokenizer, overwrite=True,
        )  # fmt: skip

    def summary(self) -> dict:
        """Held-out percentile before and after, the ledger, the last calibration."""
        return self.progress.summary(arm=self.config.arm, environment=self.environment)

    def close(self) -> None:
        """Closes the outcome source (its executors and sandboxes), the checkpoints and
        the workdir's lock: each whatever the others raise; a second call does nothing."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        try:
            if getattr(self, "executions", None) is not None:
                self.executions.source.close()  # First: it stops the programs still running.
        finally:
            try:
                if getattr(self, "checkpointer", None) is not None:
                    self.checkpointer.close()
            finally:
                if getattr(self, "_lock", None) is not None:
                    self._lock.release()


def train_and_evaluate(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    outcomes=None,
    prebuilt: agents.Built | None = None,
    hooks: Sequence[StepHook] = (),
    console: bool = False,
) -> dict:
    """Builds a `Trainer`, runs it to `config.num_steps` (resuming if possible)."""
    trainer = Trainer(
        config, workdir, outcomes=outcomes, prebuilt=prebuilt, hooks=hooks, console=console
    )
    try:
        return trainer.run()
    finally:
        trainer.close()
