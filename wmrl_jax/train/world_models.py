"""The world model a run's arms read, by `config.world_model.kind`: one table of kinds.

* ``"agent"`` (default): the agent's own world-model pass (`Agent.predict`),
  the learned world model;
* ``"synthetic"``: `wmrl_jax.worldmodel.synthetic.SyntheticWorldModel`, a
  prediction of chosen within-group Spearman q over the recipe table
  (`config.executor.table`), charged as the agent's pass.

Each kind's factory takes its sub-config (`config.world_model.<kind>`, where it
has one), the agent and the run's config; whatever it returns answers
`predict(params, tasks, rollout, *, key) -> WMOutput`. The trainer's world-model
stage (`Predictor`) calls it where it called the agent; a new kind is a new
factory and one line in `KINDS`.

Example:
    >>> wm = make(config, agent)                                # doctest: +SKIP
    >>> out = wm.predict(params, tasks, rollout, key=key)      # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from wmrl_jax.agents.base import WMOutput
from wmrl_jax.train.ledger import LedgerStep
from wmrl_jax.train.records import Sampled
from wmrl_jax.worldmodel import synthetic

log = logging.getLogger(__name__)


def _agent(sub, agent, config):
    del sub, config
    return agent


def _synthetic(sub, agent, config):
    from wmrl_jax.train import builder

    table = builder.load_table(config)
    return synthetic.SyntheticWorldModel(agent, table, builder.reward_floors(config), sub)


# kind -> (factory(sub_config, agent, config), default sub-config or None, its validator)
KINDS: dict[str, tuple[Callable, Callable | None, Callable | None]] = {
    "agent": (_agent, None, None),
    "synthetic": (_synthetic, synthetic.default_config, synthetic.validate_config),
}


def default_config() -> ml_collections.ConfigDict:
    """`config.world_model`: the kind and each kind's sub-config."""
    c = ml_collections.ConfigDict()
    c.kind = "agent"
    for kind, (_, defaults, _) in KINDS.items():
        if defaults is not None:
            c[kind] = defaults()
    return c


def validate(config: ml_collections.ConfigDict, *, replayable: bool) -> None:
    """Raises ValueError naming the first bad field of `config.world_model`.

    Args:
      config: the training config.
      replayable: whether the agent's programs are recipes the table answers.
    """
    c = config.world_model
    if c.kind not in KINDS:
        raise ValueError(f"config.world_model.kind must be one of {tuple(KINDS)}, got {c.kind!r}")
    if c.kind == "synthetic" and not replayable:
        raise ValueError(
            "config.world_model.kind='synthetic' reads programs' true rewards from the recipe "
            f"table; the {config.agent.kind!r} agent's programs are not recipes"
        )
    check = KINDS[c.kind][2]
    if check is not None:
        check(c[c.kind])


def make(config: ml_collections.ConfigDict, agent):
    """The world model of `config.world_model.kind` for a run with `agent`."""
    kind = config.world_model.kind
    factory, defaults, _ = KINDS[kind]
    return factory(config.world_model[kind] if defaults else None, agent, config)


@dataclasses.dataclass(frozen=True)
class Predictor:
    """The step's world-model stage: predictions for every sample, charged to the ledger.

    Attributes:
      model: the world model (`make`).
      frozen_params: the starting backbone's params under ``config.agent.wm_params =
        "initial"`` (the world model stays frozen); None: the policy's own params,
        which drift with RL (the same weights answer both prompts).
    """

    model: Any
    frozen_params: Any = None

    @classmethod
    def of(cls, config: ml_collections.ConfigDict, agent, params) -> Predictor:
        """The stage of a run whose agent starts from `params`."""
        frozen = None
        if config.agent.wm_params == "initial":  # A copy: the policy's params are donated.
            frozen = jax.tree.map(lambda x: jnp.array(x, copy=True), params)
        return cls(make(config, agent), frozen)

    def predict(self, params, sampled: Sampled, key, timing: LedgerStep) -> WMOutput:
        """The predictions for `sampled`'s rows, under `params` (the policy's) or the
        frozen ones; their seconds, tokens and rows go to `timing`."""
        params = params if self.frozen_params is None else self.frozen_params
        with timing.timed("wm_seconds"):
            wm = self.model.predict(params, list(sampled.tasks), sampled.rollout, key=key)
        asked = int(np.sum(~sampled.no_program))  # rows with a program
        timing.add(wm_tokens=wm.wm_tokens, wm_rows=asked)
        if asked and wm.parse_failures == asked:
            log.warning(
                "step %d: the world model produced no usable prediction; rewards come "
                "from anchors only (the other rows are masked out of the update)",
                sampled.step,
            )
        return wm
