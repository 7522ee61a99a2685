"""The loop's view of the backbone: an `Agent` proposes programs and predicts their outcomes.

The trainer never looks inside the backbone. It asks an agent for a rollout
(G programs per task, with the train-step batch that produced them) and for
world-model predictions of those programs, and it asks for greedy programs
on held-out tasks. Two agents implement the protocol:

* `RecipeAgent` (here): a small Qwen3-architecture backbone over the recipe
  vocabulary (`wmrl_jax.train.recipe_lm`), for the CPU main job and the
  compute study. Its programs are compiled recipes.
* `TextAgent` (`wmrl_jax.train.text_agent`): a real LLM checkpoint writing
  free-form Python and answering the world-model prompt in JSON.

Rows are task-major: with N = len(tasks) * G, row i belongs to tasks[i // G].
Everything returned is numpy with shapes fixed by the config, so the jitted
train step compiles once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from wmrl_jax.envs import recipes
from wmrl_jax.envs.task import Task
from wmrl_jax.train import recipe_lm


class Rollout(NamedTuple):
    """G sampled programs per task and the batch that scores them.

    Attributes:
      programs: N program sources, task-major.
      batch: train-step arrays `tokens`, `attention_mask`, `loss_mask`,
        `old_logprobs`, each of shape [N, T].
      gen_tokens: tokens processed by generation (prompts and samples).
    """

    programs: list[str]
    batch: dict[str, np.ndarray]
    gen_tokens: int


class WMOutput(NamedTuple):
    """World-model predictions for a rollout.

    Attributes:
      mean: predicted rewards of shape [N], NaN where unusable.
      var: predictive variances of shape [N], inf where unusable.
      wm_tokens: tokens processed by the world-model pass.
      parse_failures: predictions that could not be read.
    """

    mean: np.ndarray
    var: np.ndarray
    wm_tokens: int
    parse_failures: int


class Agent(Protocol):
    """What the training loop needs from a backbone."""

    def rollout(self, params, tasks: Sequence[Task], *, group_size: int, key) -> Rollout: ...

    def predict(self, params, tasks: Sequence[Task], rollout: Rollout, *, key) -> WMOutput: ...

    def greedy_programs(self, params, tasks: Sequence[Task]) -> list[str]: ...


class RecipeAgent:
    """A small backbone that writes recipes and reads its own score bins.

    Args:
      graphdef: the backbone's `nnx.GraphDef`.
      vocab: the `recipe_lm.RecipeVocab` it was built for.
      temperature: sampling temperature of the policy.
      min_mass: below this probability on the score-bin tokens a prediction
        is unusable (infinite variance).
    """

    def __init__(self, graphdef, vocab, *, temperature: float = 1.0, min_mass: float = 0.05):
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.graphdef = graphdef
        self.vocab = vocab
        self.temperature = float(temperature)
        self.min_mass = float(min_mass)
        self._prompts: dict[str, np.ndarray] = {}
        self._sample = jax.jit(
            lambda params, prompts, key, greedy: recipe_lm.sample_recipes(
                graphdef,
                params,
                prompts,
                key,
                vocab=vocab,
                temperature=self.temperature,
                greedy=greedy,
            ),
            static_argnames="greedy",
        )
        self._predict = jax.jit(
            lambda params, prompts, tokens: recipe_lm.wm_predict(
                graphdef, params, prompts, tokens, vocab=vocab, min_mass=self.min_mass
            )
        )

    def prompts(self, tasks: Sequence[Task]) -> np.ndarray:
        """Prompt tokens of shape [len(tasks), P], cached per task id."""
        for t in tasks:
            if t.id not in self._prompts:
                self._prompts[t.id] = np.asarray(recipe_lm.task_prompt(self.vocab, t), np.int32)
        return np.stack([self._prompts[t.id] for t in tasks])

    def _programs(self, tasks: Sequence[Task], tokens: np.ndarray, group_size: int) -> list[str]:
        recipes_ = recipe_lm.recipes_from_tokens(self.vocab, tokens)
        return [recipes.compile_program(r, tasks[i // group_size]) for i, r in enumerate(recipes_)]

    def rollout(self, params, tasks: Sequence[Task], *, group_size: int, key) -> Rollout:
        prompts = np.repeat(self.prompts(tasks), group_size, axis=0)
        sample = self._sample(params, jnp.asarray(prompts), key, False)
        tokens = np.asarray(sample.tokens)
        batch = recipe_lm.policy_batch(prompts, sample, np.zeros(len(prompts), np.float32))
        batch = {k: np.asarray(v) for k, v in batch.items() if k != "advantages"}
        gen_tokens = int(prompts.size + tokens.size)
        return Rollout(self._programs(tasks, tokens, group_size), batch, gen_tokens)

    def recipe_tokens(self, rollout: Rollout) -> np.ndarray:
        """The sampled recipe tokens of a rollout, of shape [N, S]."""
        s = len(recipes.SLOTS)
        tokens, mask = rollout.batch["tokens"], rollout.batch["loss_mask"] > 0
        return tokens[mask].reshape(len(tokens), s)

    def predict(self, params, tasks: Sequence[Task], rollout: Rollout, *, key) -> WMOutput:
        del key  # The readout is deterministic.
        g = len(rollout.programs) // len(tasks)
        prompts = np.repeat(self.prompts(tasks), g, axis=0)
        recipe_tokens = self.recipe_tokens(rollout)
        mean, var, _ = self._predict(params, jnp.asarray(prompts), jnp.asarray(recipe_tokens))
        mean, var = np.asarray(mean, np.float32), np.asarray(var, np.float32)
        failures = int(np.sum(~np.isfinite(var)))
        # [prompt, recipe, PREDICT] per row, one forward each.
        wm_tokens = int(prompts.size + recipe_tokens.size + len(prompts))
        return WMOutput(mean, var, wm_tokens, failures)

    def aux_batch(self, tasks: Sequence[Task], rollout: Rollout, real, executed) -> dict:
        """World-model targets on executed samples, for the train step's auxiliary loss.

        Returns `aux_tokens` [N, P+S+2] = [prompt, recipe, PREDICT, bin of the real
        reward] and `aux_mask` [N, P+S+2], 1 on the bin token of executed samples.
        """
        g = len(rollout.programs) // len(tasks)
        prompts = np.repeat(self.prompts(tasks), g, axis=0)
        recipe_tokens = self.recipe_tokens(rollout)
        seq = np.asarray(recipe_lm.wm_tokens(prompts, recipe_tokens, vocab=self.vocab))
        ok = np.asarray(executed, bool) & np.isfinite(real)
        bins = self.vocab.bin_ids()[self.vocab.reward_to_bin(np.where(ok, real, 0.0))]
        bins = np.where(ok, bins, self.vocab.pad).astype(np.int32)
        tokens = np.concatenate([seq, bins[:, None]], axis=1).astype(np.int32)
        mask = np.zeros(tokens.shape, np.float32)
        mask[:, -1] = ok
        return {"aux_tokens": tokens, "aux_mask": mask}

    def greedy_programs(self, params, tasks: Sequence[Task]) -> list[str]:
        prompts = self.prompts(tasks)
        sample = self._sample(params, jnp.asarray(prompts), jax.random.key(0), True)
        return self._programs(tasks, np.asarray(sample.tokens), 1)


def describe_programs(agent: Any, rollout: Rollout) -> list[str]:
    """Short labels for a rollout's programs (recipe names where known)."""
    if isinstance(agent, RecipeAgent):
        tokens = agent.recipe_tokens(rollout)
        return [recipes.describe(r) for r in recipe_lm.recipes_from_tokens(agent.vocab, tokens)]
    return [p.strip().splitlines()[0][:60] if p.strip() else "<empty>" for p in rollout.programs]
