r"""Exact evaluation's cost: `studies.exact.recipe_probs` against a full-sequence pass.

    python -m benchmarks.exact [--repeats 5] [--json out.json]

`recipe_probs` scores every recipe of every task from one pass of the prompt
into a key/value cache and one of the distinct prefixes of S-1 slots on copies
of it (96 rows of 2 tokens per task on the recipe benchmark);
the anchor, `full_sequence`, teacher-forces all R = 288 recipes (the
straightforward version, which `recipe_probs` replaced). Both run jitted on
the same tasks (the core suite's training and held-out tasks) and the
study's backbone with random weights; the report gives the median seconds of
each, the ratio and the largest disagreement in log-probability.
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.forward import write_json
from benchmarks.fusion import median_seconds
from experiments.configs import study_compute
from wmrl_jax import models
from wmrl_jax.agents.recipe import lm
from wmrl_jax.agents.recipe.agent import RecipeAgent
from wmrl_jax.models import qwen3
from wmrl_jax.studies import exact
from wmrl_jax.train import builder


@functools.partial(jax.jit, static_argnames=("graphdef", "vocab"))
def _full_log_probs(graphdef, params, prompts, recipes, temperature, *, vocab):
    t, p = prompts.shape
    r, s = recipes.shape
    seq = jnp.concatenate([jnp.repeat(prompts, r, axis=0), jnp.tile(recipes, (t, 1))], axis=1)
    logits = qwen3.apply(graphdef, params, seq)[:, p - 1 : p + s - 1]
    allowed = jnp.asarray(vocab.slot_mask())
    masked = jnp.where(allowed[None], logits / temperature, -jnp.inf)
    logp = jax.nn.log_softmax(masked, axis=-1)
    return jnp.take_along_axis(logp, seq[:, p:, None], axis=-1)[..., 0].sum(-1).reshape(t, r)


def full_sequence(agent, params, tasks, chunk: int = 8) -> np.ndarray:
    """p(recipe | task) [T, R] by teacher-forcing every recipe after the prompt."""
    recipes = jnp.asarray(lm.all_recipe_tokens(agent.vocab))

    def log_probs(prompts):
        return _full_log_probs(
            agent.graphdef, params, prompts, recipes, agent.temperature, vocab=agent.vocab
        )

    return exact.by_chunks(log_probs, agent.prompts(tasks), chunk, recipes.shape[0])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    config = study_compute.get_config("runlocal")
    sets = builder.load_tasks(config)
    tasks = [*sets.train, *sets.heldout]
    vocab = lm.RecipeVocab()
    model = models.random_model(lm.make_backbone(vocab), jax.random.key(0))
    agent = RecipeAgent(model.graphdef, vocab, temperature=1.0)
    full = full_sequence(agent, model.params, tasks)
    shared = exact.recipe_probs(agent, model.params, tasks)
    report = {
        "tasks": len(tasks),
        "full_sequence_s": median_seconds(lambda: full_sequence(agent, model.params, tasks),
                                          repeats=args.repeats),
        "recipe_probs_s": median_seconds(lambda: exact.recipe_probs(agent, model.params, tasks),
                                         repeats=args.repeats),
        "max_abs_log_prob_diff": float(np.abs(np.log(full) - np.log(shared)).max()),
        "platform": jax.default_backend(),
    }  # fmt: skip
    report["speedup"] = report["full_sequence_s"] / report["recipe_probs_s"]
    print(
        f"{report['tasks']} tasks: full_sequence {report['full_sequence_s']:.3f} s, "
        f"recipe_probs {report['recipe_probs_s']:.3f} s ({report['speedup']:.2f}x); "
        f"largest |log p| difference {report['max_abs_log_prob_diff']:.2e}"
    )
    write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
