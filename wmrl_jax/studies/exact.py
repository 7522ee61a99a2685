"""Exact evaluation on the replay benchmark: the policy's sampling distribution × the table.

On the recipe benchmark a policy writes one of R recipes per task, and the
recipe table records every (task, recipe) outcome K times. So a policy's
*expected* reward, over its own sampling and over the replicates, is a sum
that can be computed exactly, at no execution cost and without sampling noise:

    E[value | task] = Σ_r p(r | task) · value(task, r),

with p(r | task) the product over the recipe's slots of the policy's
temperature-scaled softmax restricted to each slot's tokens (exactly what
`recipe_lm.sample_recipes` draws from), evaluated for all R recipes by
teacher forcing. Two values per recipe:

* `heldout_value`: the held-out evaluation's number, one execution's board
  percentile (0 when it is not valid), averaged over the K replicates: the
  program's expected percentile. (`train.evaluation.evaluate` estimates the
  same sum with sampled programs, each executed once in replicate 0, so it
  carries sampling noise and one replicate's noise besides.)
* `train_value`: the training reward (percentile, or the floor of a failed
  status), averaged over the replicates: the true reward of the oracle
  (`oracle/true_reward`), in expectation over the policy.

`exact_hook` records both after every update (`every`); `exact_metrics` is
the same evaluation for any params (e.g. the warm start, before step 1).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from wmrl_jax.agents.recipe import lm as recipe_lm
from wmrl_jax.envs.tabular import RecipeTable
from wmrl_jax.envs.task import Task


@functools.partial(jax.jit, static_argnames=("graphdef", "vocab"))
def _log_probs(graphdef, params, prompts, prefixes, recipes, prefix_of, temperature, *, vocab):
    """log p(recipe | prompt) for every pair: prompts [T, P], recipes [R, S] -> [T, R].

    A recipe's slot s is predicted from the prompt and its first s slots, so the U
    distinct prefixes of S-1 slots (`prefixes` [U, S-1], `prefix_of` [R]: each recipe's
    row there) give every slot's distribution: the prompt runs once per task into a
    key/value cache (its last position predicts slot 0), and the U prefixes run on
    copies of that cache, S-1 tokens each (96 x 2 tokens instead of 288 x (P + 3)).
    """
    t, p = prompts.shape
    u, rest = prefixes.shape
    model = nnx.merge(graphdef, params)
    slots = p + rest
    slot = jnp.arange(slots)
    cache = model.init_cache(t, slots, model.embed_tokens[...].dtype)
    causal = slot[None, :] <= jnp.arange(slots)[:, None]  # [slots, slots]
    first, cache = model(
        prompts.astype(jnp.int32), jnp.broadcast_to(jnp.arange(p), (t, p)),
        jnp.broadcast_to(causal[:p], (t, p, slots)), cache, 0, last_only=True,
    )  # fmt: skip
    cache = jax.tree.map(lambda x: jnp.repeat(x, u, axis=0), cache)
    then, _ = model(
        jnp.tile(prefixes, (t, 1)).astype(jnp.int32),
        jnp.broadcast_to(p + jnp.arange(rest), (t * u, rest)),
        jnp.broadcast_to(causal[p:], (t * u, rest, slots)), cache, p,
    )  # fmt: skip
    logits = jnp.concatenate([jnp.repeat(first, u, axis=0), then], axis=1)  # [T·U, S, V]
    allowed = jnp.asarray(vocab.slot_mask())  # [S, V]
    masked = jnp.where(allowed[None], logits.astype(jnp.float32) / temperature, -jnp.inf)
    logp = jax.nn.log_softmax(masked, axis=-1).reshape(t, u, *allowed.shape)
    slot_ids = jnp.arange(recipes.shape[1])
    picked = logp[:, prefix_of[:, None], slot_ids[None, :], recipes]  # [T, R, S]
    return picked.sum(-1)


def recipe_probs(agent, params, tasks: Sequence[Task], *, chunk: int = 8) -> np.ndarray:
    """The policy's probability of writing each recipe, float64 [len(tasks), R].

    `agent` is a `RecipeAgent` (its graphdef, vocab and sampling temperature);
    rows sum to 1 up to float32 rounding. Tasks go through in chunks of
    `chunk` (one compilation per chunk shape).
    """
    tokens = recipe_lm.all_recipe_tokens(agent.vocab)
    prefixes, prefix_of = np.unique(tokens[:, :-1], axis=0, return_inverse=True)
    recipes, prefixes, prefix_of = map(jnp.asarray, (tokens, prefixes, prefix_of.reshape(-1)))

    def log_probs(prompts):
        return _log_probs(
            agent.graphdef, params, prompts, prefixes, recipes, prefix_of, agent.temperature,
            vocab=agent.vocab,
        )  # fmt: skip

    return by_chunks(log_probs, agent.prompts(tasks), chunk, len(tokens))


def by_chunks(log_probs: Callable, prompts: np.ndarray, chunk: int, num_recipes: int):
    """exp(log_probs(prompts)) as float64 [T, R], `chunk` prompts at a time; the last chunk
    is padded with its first prompt, so every call has one shape (one compilation)."""
    out = []
    for i in range(0, len(prompts), chunk):
        part = prompts[i : i + chunk]
        pad = chunk - len(part)
        part = np.concatenate([part, np.repeat(part[:1], pad, axis=0)]) if pad else part
        out.append(np.asarray(log_probs(jnp.asarray(part)), np.float64)[: chunk - pad])
    return np.exp(np.concatenate(out)) if out else np.zeros((0, num_recipes))


def heldout_value(table: RecipeTable, task_id: str) -> np.ndarray:
    """One held-out execution's percentile per recipe (0 unless valid), replicate mean, [R]."""
    return np.nan_to_num(table.replicate_percentile(task_id), nan=0.0).mean(axis=1)


def train_value(table: RecipeTable, task_id: str, floors) -> np.ndarray:
    """The training reward per recipe (floors for failures), replicate mean, [R]."""
    return table.replicate_reward(task_id, floors).mean(axis=1)


def expected(probs: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per task Σ_r probs[t, r] · values[t, r], float64 [T]."""
    return np.einsum("tr,tr->t", np.asarray(probs, np.float64), np.asarray(values, np.float64))


def exact_metrics(agent, params, train: Sequence[Task], heldout: Sequence[Task], values) -> dict:
    """`exact/train_reward` and `exact/heldout_percentile`: the policy's expected values,
    means over the tasks; `values` = `task_values(...)`."""
    train_v, heldout_v = values
    return {
        "exact/train_reward": float(expected(recipe_probs(agent, params, train), train_v).mean()),
        "exact/heldout_percentile": float(
            expected(recipe_probs(agent, params, heldout), heldout_v).mean()
        ),
    }


def task_values(source, train: Sequence[Task], heldout: Sequence[Task]):
    """The value tables [T, R] of the train and held-out tasks from a replay `source`
    (`envs.outcomes.ReplayExecutor`: its table and reward floors)."""
    table, floors = source.table, source.floors
    return (
        np.stack([train_value(table, t.id, floors) for t in train]),
        np.stack([heldout_value(table, t.id) for t in heldout]),
    )


def exact_hook(
    agent, params: Callable[[], object], source, train, heldout, *, every: int = 1, values=None
) -> Callable:
    """A step hook: `exact_metrics` of the current params every `every` steps (and none
    between), so the study's curves of expected value are dense and noise-free.

    Args:
      agent: the run's `RecipeAgent`.
      params: returns the policy's params after the step's update (e.g.
        `lambda: trainer.state.params`).
      source: the replay outcome source (its table and floors).
      train, heldout: the task lists.
      every: steps between evaluations (1: every update).
      values: `task_values(source, train, heldout)`, if already made.
    """
    values = task_values(source, train, heldout) if values is None else values

    def hook(record) -> dict[str, float]:
        if record.step % every:
            return {}
        return exact_metrics(agent, params(), train, heldout, values)

    return hook
