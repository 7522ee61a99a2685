"""The `recipe` agent kind: a tiny backbone over the recipe vocabulary, warm-started.

Modules: `vocab` (tokens, task prompts), `lm` (sampling, world-model readout,
warm start), `agent` (`RecipeAgent`, the `Agent` protocol). This module is the
kind's registry entry: `default_config`, `make_agent`, `CAPABILITIES`.
"""

from __future__ import annotations

import os

import jax
import ml_collections
import numpy as np

from wmrl_jax.agents.base import AgentContext, Built, Capabilities
from wmrl_jax.envs import recipes

# Program features: the recipe's slots (preprocessing, model, two hyperparameters).
CAPABILITIES = Capabilities(aux_loss=True, replayable=True, program_features=len(recipes.SLOTS))


def default_config() -> ml_collections.ConfigDict:
    """`config.agent.recipe`: the backbone's size, sampling and warm start."""
    c = ml_collections.ConfigDict()
    c.hidden_size = 64
    c.num_layers = 2
    c.num_heads = 4
    c.temperature = 1.0
    # Below this probability on the score-bin tokens a prediction is unusable.
    c.min_mass = 0.05
    # A short supervised pass on the pretrain tasks' recipe-table rewards:
    # behaviour cloning of good recipes and the world model's score bins.
    c.warm_start = ml_collections.ConfigDict()
    c.warm_start.steps = 150
    c.warm_start.batch_size = 256
    c.warm_start.lr = 3e-3
    c.warm_start.temperature = 0.1
    c.warm_start.table = ""  # The recipe table it learns from; "" = the committed one.
    return c


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Raises ValueError naming the first bad field of `config.agent.recipe`."""
    w = config.warm_start
    checks = (
        ("hidden_size", config.hidden_size, config.hidden_size >= 1, ">= 1"),
        ("num_layers", config.num_layers, config.num_layers >= 1, ">= 1"),
        ("num_heads", config.num_heads, config.num_heads >= 1, ">= 1"),
        ("temperature", config.temperature, config.temperature > 0, "> 0"),
        ("min_mass", config.min_mass, 0.0 <= config.min_mass < 1.0, "in [0, 1)"),
        ("warm_start.steps", w.steps, w.steps >= 0, ">= 0"),
        ("warm_start.batch_size", w.batch_size, w.batch_size >= 1, ">= 1"),
        ("warm_start.lr", w.lr, w.lr > 0, "> 0"),
        ("warm_start.temperature", w.temperature, w.temperature > 0, "> 0"),
    )
    for field, value, ok, rule in checks:
        if not ok:
            raise ValueError(f"config.agent.recipe.{field} must be {rule}, got {value}")


def load_table(path: str = ""):
    """The recipe benchmark table at `path` ("" = the committed one)."""
    from wmrl_jax.envs import tabular

    return tabular.RecipeTable.load(os.path.expanduser(path) or None)


def make_agent(config: ml_collections.ConfigDict, context: AgentContext, *, table=None) -> Built:
    """A `RecipeAgent` on a fresh backbone, warm-started on the pretrain tasks.

    Args:
      config: `config.agent.recipe` (see `default_config`).
      context: the run's tasks, reward floors and key.
      table: an already loaded recipe table (else `config.warm_start.table` is read).
    """
    from wmrl_jax.agents.recipe import lm
    from wmrl_jax.agents.recipe.agent import RecipeAgent
    from wmrl_jax.models import api

    vocab = lm.RecipeVocab()
    raw = lm.make_backbone(
        vocab, hidden_size=config.hidden_size, num_layers=config.num_layers,
        num_heads=config.num_heads,
    )  # fmt: skip
    init_key, warm_key = jax.random.split(context.key)
    model = api.random_model(raw, init_key)
    params, info = model.params, {}
    w = config.warm_start
    if w.steps > 0:
        if not context.pretrain:
            raise ValueError(
                "config.agent.recipe.warm_start.steps > 0 but there are no pretrain tasks"
            )
        table = table if table is not None else load_table(w.table)
        data = lm.warm_start_data(
            vocab,
            np.stack([lm.task_prompt(vocab, t) for t in context.pretrain]),
            np.stack([table.reward(t.id, context.floors) for t in context.pretrain]),
        )
        params, info = lm.warm_start(
            model.graphdef, params, data, steps=w.steps, batch_size=w.batch_size, lr=w.lr,
            key=warm_key, temperature=w.temperature, vocab=vocab,
        )  # fmt: skip
    agent = RecipeAgent(
        model.graphdef, vocab, temperature=config.temperature, min_mass=config.min_mass
    )
    return Built(agent, params, model.graphdef, raw, {"warm_start": info})
