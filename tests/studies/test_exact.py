"""Exact expected evaluation against brute-force enumeration and Monte-Carlo sampling."""

import jax
import numpy as np
import pytest

from experiments.configs import study_compute
from wmrl_jax import models
from wmrl_jax.agents.recipe import lm
from wmrl_jax.agents.recipe.agent import RecipeAgent
from wmrl_jax.envs import recipes
from wmrl_jax.models import qwen3
from wmrl_jax.studies import exact
from wmrl_jax.train import builder

TEMPERATURE = 0.15  # Peaked: the random policy's mass is far from uniform over recipes.


@pytest.fixture(scope="module")
def setup():
    config = study_compute.get_config("runlocal")
    tasks = builder.load_tasks(config)
    source, _ = builder.make_outcomes(config, table=builder.load_table(config))
    vocab = lm.RecipeVocab()
    raw = lm.make_backbone(vocab, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1)
    model = models.random_model(raw, jax.random.key(3))
    agent = RecipeAgent(model.graphdef, vocab, temperature=TEMPERATURE)
    return agent, model.params, tasks, source


def _enumerated(agent, params, task) -> np.ndarray:
    """p(recipe) of every recipe, by enumeration in float64 numpy from full-sequence logits."""
    vocab = agent.vocab
    tokens = lm.all_recipe_tokens(vocab).astype(np.int32)  # [R, S]
    prompt = agent.prompts([task])[0]
    p = len(prompt)
    seq = np.concatenate([np.repeat(prompt[None], len(tokens), 0), tokens], axis=1)
    logits = np.asarray(jax.jit(qwen3.apply, static_argnums=0)(agent.graphdef, params, seq))
    mask = vocab.slot_mask()
    probs = np.ones(len(tokens))
    for s in range(vocab.num_slots):
        z = logits[:, p + s - 1].astype(np.float64) / agent.temperature
        z = np.where(mask[s], z, -np.inf)
        z = np.exp(z - z.max(axis=1, keepdims=True))
        probs *= z[np.arange(len(tokens)), tokens[:, s]] / z.sum(axis=1)
    return probs


def test_recipe_probs_match_enumeration(setup):
    agent, params, tasks, _ = setup
    chosen = tasks.heldout[:3]
    probs = exact.recipe_probs(agent, params, chosen, chunk=2)  # A padded last chunk.
    assert probs.shape == (3, recipes.NUM_RECIPES)
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-5)
    for i, task in enumerate(chosen):
        np.testing.assert_allclose(probs[i], _enumerated(agent, params, task), atol=2e-6)
    assert probs.max() > 20.0 / recipes.NUM_RECIPES  # Far from uniform: the test has bite.


def test_expected_values_match_monte_carlo(setup):
    agent, params, tasks, source = setup
    task = tasks.heldout[0]
    values = exact.heldout_value(source.table, task.id)
    # By hand: one execution's percentile, 0 where invalid, over the replicates.
    pct = source.table.replicate_percentile(task.id)
    np.testing.assert_allclose(values, np.where(np.isfinite(pct), pct, 0.0).mean(1))
    probs = exact.recipe_probs(agent, params, [task])
    want = exact.expected(probs, values[None])[0]
    assert want == pytest.approx(float(probs[0] @ values), abs=1e-12)
    n = 8192
    rollout = agent.rollout(params, [task], group_size=n, key=jax.random.key(11))
    drawn = np.array([source.recipe_of(task, p) for p in rollout.programs])
    freq = np.bincount(drawn, minlength=recipes.NUM_RECIPES) / n
    # Frequencies within 5 binomial standard errors of the exact probabilities.
    se = np.sqrt(probs[0] * (1 - probs[0]) / n) + 1e-4
    assert np.all(np.abs(freq - probs[0]) < 5 * se)
    mc = values[drawn]
    assert abs(mc.mean() - want) < 5 * mc.std() / np.sqrt(n) + 1e-9
    # The training value: the oracle's true reward of each recipe.
    train = tasks.train[0]
    tv = exact.train_value(source.table, train.id, source.floors)
    program = recipes.compile_program(recipes.recipe_from_index(7), train)
    assert tv[7] == pytest.approx(source.lookup(train, program).reward, abs=1e-12)


def test_exact_metrics_and_hook(setup):
    agent, params, tasks, source = setup
    train, heldout = tasks.train[:2], tasks.heldout[:2]
    values = exact.task_values(source, train, heldout)
    m = exact.exact_metrics(agent, params, train, heldout, values)
    probs = exact.recipe_probs(agent, params, heldout)
    assert m["exact/heldout_percentile"] == pytest.approx(
        float(np.mean((probs * values[1]).sum(1))), abs=1e-12
    )
    hook = exact.exact_hook(agent, lambda: params, source, train, heldout, every=2)

    class Record:
        step = 3

    assert hook(Record()) == {}
    Record.step = 4
    assert hook(Record()) == m
