"""The trainer's view of a backbone: an `Agent` proposes programs and predicts their outcomes.

The trainer never looks inside the backbone. It asks an agent for a rollout
(G programs per task, with the train-step batch that produced them), for
world-model predictions of those programs, for greedy programs on held-out
tasks, and for the auxiliary world-model targets of executed programs; it
tells the agent what each executed program scored. Every method it calls is
declared on `Agent`: an agent kind that has nothing to do for one (no
auxiliary loss, no in-context anchors) implements it as a no-op.

Rows are task-major: with N = len(tasks) * G, row i belongs to tasks[i // G].
Everything returned is numpy with shapes fixed by the config, so the jitted
train step compiles once.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np

from wmrl_jax.envs.grading import RewardFloors
from wmrl_jax.envs.task import Task


class Rollout(NamedTuple):
    """G sampled programs per task and the batch that scores them.

    Attributes:
      programs: N program sources, task-major.
      batch: train-step arrays `tokens`, `attention_mask`, `loss_mask`,
        `old_logprobs`, each of shape [N, T].
      gen_tokens: tokens processed by generation (prompts and samples).
      causes: per row, "ok" or why the sample holds no program (a cause of
        `wmrl_jax.agents.programs.PROGRAM_CAUSES`; its program is then ""):
        such a row is an invalid outcome, never executed and charged nothing.
        Empty when every row holds a program (agents whose samples always do).
      features: int categorical program features of shape [N, F] for the local
        correction (`Capabilities.program_features` = F), or None (F = 0).
      transcripts: per row, what happened before the submission in a
        multi-turn episode (`wmrl_jax.agents.text.episodes`), shown to the world
        model; empty for single-turn samples.
      tool_calls: sandbox tool calls made during the episodes (not
        executions of the submitted programs).
      tool_seconds: their summed sandbox seconds (resource-seconds, like
        `Ledger.exec_seconds`, but of their own kind).
      tool_wait_seconds: wall seconds the rollout spent waiting on them
        (inside the rollout's wall time, during which nothing generates).
    """

    programs: list[str]
    batch: dict[str, np.ndarray]
    gen_tokens: int
    causes: tuple[str, ...] = ()
    features: np.ndarray | None = None
    transcripts: tuple[str, ...] = ()
    tool_calls: int = 0
    tool_seconds: float = 0.0
    tool_wait_seconds: float = 0.0


class WMOutput(NamedTuple):
    """World-model predictions for a rollout.

    Attributes:
      mean: predicted rewards of shape [N], NaN where unusable.
      var: predictive variances of shape [N], inf where unusable.
      wm_tokens: tokens processed by the world-model pass.
      parse_failures: predictions that could not be read.
      parse_causes: unusable sampled answers per cause
        (`wmrl_jax.worldmodel.FAILURE_STATUSES`, every cause present), for
        agents that parse free-text answers; empty otherwise.
      clamped: sampled answers with a number outside [0, 1] (clamped).
      diagnostics: scalars a world model reports about its own pass (e.g. a
        synthetic one's realised quality), logged as ``wm/<name>``.
    """

    mean: np.ndarray
    var: np.ndarray
    wm_tokens: int
    parse_failures: int
    parse_causes: Mapping[str, int] = types.MappingProxyType({})
    clamped: int = 0
    diagnostics: Mapping[str, float] = types.MappingProxyType({})


class Agent(Protocol):
    """What the trainer needs from a backbone (policy and world model in one).

    Attributes:
      tokenizer: the `transformers` tokenizer exported with the policy, or None.
    """

    tokenizer: Any

    def rollout(self, params, tasks: Sequence[Task], *, group_size: int, key) -> Rollout:
        """Samples `group_size` programs per task."""
        ...

    def predict(self, params, tasks: Sequence[Task], rollout: Rollout, *, key) -> WMOutput:
        """World-model predictions of every program of `rollout`."""
        ...

    def greedy_programs(self, params, tasks: Sequence[Task]) -> list[str]:
        """One greedy program per task (held-out evaluation); "" where it holds none."""
        ...

    def aux_batch(
        self, tasks: Sequence[Task], rollout: Rollout, real: np.ndarray, executed: np.ndarray
    ) -> dict[str, np.ndarray]:
        """Auxiliary world-model targets from executed rows (`real`, `executed` of shape
        [N]) for the train step's `aux_tokens` / `aux_mask`; `{}` when the agent has none."""
        ...

    def observe(self, task: Task, program: str, outcome) -> None:
        """Records an executed program's outcome (e.g. as an in-context anchor)."""
        ...

    def describe(self, rollout: Rollout) -> list[str]:
        """Short human-readable labels of a rollout's programs."""
        ...


@dataclasses.dataclass(frozen=True)
class AgentContext:
    """Run-wide inputs an agent factory may need beside its own sub-config.

    Attributes:
      train, heldout, pretrain: the run's tasks by split.
      floors: rewards of failed programs (`config.rewards`).
      key: PRNG key for initialisation and warm starts.
      mesh: the run's (data, fsdp, tensor) mesh, or None (one device).
      batch_sizes: rows per generation call by role ("rollout", "wm"), from the
        trainer's memory plan; None: all rows in one call.
      lora: `models.lora.attach` keywords (rank, alpha, targets) when the run trains
        adapters (`train.lora.rank` >= 1), else None.
    """

    train: Sequence[Task]
    heldout: Sequence[Task]
    pretrain: Sequence[Task]
    floors: RewardFloors
    key: Any
    mesh: Any = None
    batch_sizes: Mapping[str, int] | None = None
    lora: Mapping[str, Any] | None = None


class Built(NamedTuple):
    """What an agent factory returns.

    Attributes:
      agent: the `Agent`.
      params: the backbone's parameters (an `nnx.State`), trained by the step.
      graphdef: the backbone's `nnx.GraphDef` (the train step merges it).
      raw_config: the Hugging Face config dict, for exporting the policy.
      info: anything worth reporting (e.g. warm-start curves).
    """

    agent: Agent
    params: Any
    graphdef: Any
    raw_config: Mapping
    info: dict


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a kind can do, checked against the rest of the config before any work.

    Attributes:
      aux_loss: it provides world-model targets for `train.loss.aux_coef`.
      replayable: its programs can be answered by the recipe table (replay).
      memory_plan: it is an LLM whose generation batch sizes come from the
        trainer's memory plan (`train.memory`), passed as `AgentContext.batch_sizes`.
      program_features: F, the categorical features per program its rollouts
        carry (`Rollout.features`) for the local correction; 0: none (programs
        are then "near" when they solve the same task).
      lora: its backbone takes LoRA adapters (`train.lora`, `AgentContext.lora`).
    """

    aux_loss: bool
    replayable: bool
    memory_plan: bool = False
    program_features: int = 0
    lora: bool = False
