"""`RecipeAgent`: a small backbone that writes recipes and reads its own score bins.

The `Agent` (`wmrl_jax.agents.base`) of the CPU main job and the compute
study: a Qwen3-architecture backbone over the recipe vocabulary
(`wmrl_jax.agents.recipe.lm`). Its programs are compiled recipes; as the world
model it reads the distribution of its next token over score bins after
`[task features, recipe, PREDICT]`.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from wmrl_jax.agents.base import Rollout, WMOutput
from wmrl_jax.agents.recipe import lm as recipe_lm
from wmrl_jax.envs import recipes
from wmrl_jax.envs.task import Task


class RecipeAgent:
    """A small backbone that writes recipes and reads its own score bins.

    Args:
      graphdef: the backbone's `nnx.GraphDef`.
      vocab: the `recipe_lm.RecipeVocab` it was built for.
      temperature: sampling temperature of the policy.
      min_mass: below this probability on the score-bin tokens a prediction
        is unusable (infinite variance).
    """

    tokenizer = None  # Recipe tokens are the vocabulary; nothing to export.

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

    def _programs(
        self, tasks: Sequence[Task], tokens: np.ndarray, group_size: int
    ) -> tuple[list[str], np.ndarray]:
        """The programs, and their recipe slots [N, len(SLOTS)] as program features."""
        recipes_ = recipe_lm.recipes_from_tokens(self.vocab, tokens)
        programs = [
            recipes.compile_program(r, tasks[i // group_size]) for i, r in enumerate(recipes_)
        ]
        features = np.asarray(recipes_, np.int32).reshape(len(recipes_), len(recipes.SLOTS))
        return programs, features

    def rollout(self, params, tasks: Sequence[Task], *, group_size: int, key) -> Rollout:
        prompts = np.repeat(self.prompts(tasks), group_size, axis=0)
        sample = self._sample(params, jnp.asarray(prompts), key, False)
        tokens = np.asarray(sample.tokens)
        batch = recipe_lm.policy_batch(prompts, sample, np.zeros(len(prompts), np.float32))
        batch = {k: np.asarray(v) for k, v in batch.items() if k != "advantages"}
        count = recipe_lm.sample_token_count(len(prompts), self.vocab)
        gen_tokens = count.prompt + count.generated
        programs, features = self._programs(tasks, tokens, group_size)
        return Rollout(programs, batch, gen_tokens, features=features)

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
        wm_tokens = recipe_lm.wm_token_count(len(prompts), self.vocab).prompt
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

    def observe(self, task: Task, program: str, outcome) -> None:
        """No in-context anchors: the recipe backbone learns outcomes through `aux_batch`."""
        del task, program, outcome

    def describe(self, rollout: Rollout) -> list[str]:
        """Recipe names of a rollout's programs."""
        tokens = self.recipe_tokens(rollout)
        return [recipes.describe(r) for r in recipe_lm.recipes_from_tokens(self.vocab, tokens)]

    def greedy_programs(self, params, tasks: Sequence[Task]) -> list[str]:
        prompts = self.prompts(tasks)
        sample = self._sample(params, jnp.asarray(prompts), jax.random.key(0), True)
        return self._programs(tasks, np.asarray(sample.tokens), 1)[0]
