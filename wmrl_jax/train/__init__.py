"""The generic GRPO trainer: config, arms, stages, loop, state and step, ledger, checkpoints.

`train/` composes `wmrl_jax.core` with an agent (`wmrl_jax.agents`) and an
outcome source (`wmrl_jax.train.execution.OutcomeSource`) through declared
protocols; it imports no concrete agent and no study.

* `config`: `base_config`, `validate_config`, `override`, `ConfigError`;
* `sections`: typed views of the sections that travel (agent, anchors, correction,
  executor), read from the config at the boundary;
* `arms`: the table of arms (`ARMS`), what each compared method executes and feeds;
* `builder`: tasks, outcome source, agent, correction and optimizer from a config;
* `stages`: one step as named stages; `records`: what each stage returns (`Sampled`,
  `Anchors`, `Execution`, `Fed`), composed into a frozen `StepRecord`;
* `loop`: `Trainer`, `train_and_evaluate` (the run, its steps, checkpoints);
  `progress`: the run's ledger, evaluations and step log;
* `rewards`: a step's anchor choice and reward correction (`Rewarder`);
* `resume`: the resume guard (which config changes a resumed run may make);
* `execution`, `evaluation`: anchors executed with retries (`Executions`, the
  step's execution stage); the evaluation schedule and held-out evaluation;
* `overlap`: the next step's batch, sampled while this step's programs execute;
* `state`, `loss`, `step`: `TrainState`, optimizer, mesh; the whole-batch GRPO
  loss by micro-batches; the sharded jitted `train_step`;
* `ledger`, `writer`, `console`, `summary`, `checkpoint`: the compute ledger,
  metric files, console lines, the run report, orbax checkpoints.

Example:
    >>> from wmrl_jax.train import base_config, train_and_evaluate
    >>> summary = train_and_evaluate(base_config(), "outputs/run")  # doctest: +SKIP
"""

from wmrl_jax.train.config import ConfigError, base_config, override, validate_config
from wmrl_jax.train.loop import Trainer, train_and_evaluate

__all__ = [
    "ConfigError",
    "Trainer",
    "base_config",
    "override",
    "train_and_evaluate",
    "validate_config",
]
