"""The recipe LM: one tiny Qwen3 backbone as the policy and as the world model.

Policy: slot-constrained sampling of the S recipe tokens after a task prompt
(`sample_recipes`), with sampling log-probs that a teacher-forced forward of the
train step recomputes exactly (`policy_batch` builds that step's batch).
World model: after [prompt, recipe, PREDICT] the next-token distribution over the
score-bin tokens is read by `worldmodel.readout.score_bin_readout` (`wm_predict`).
`warm_start` gives both roles a prior from a benchmark of (task, recipe, reward).

Token accounting (for the compute ledger; see `sample_token_count`,
`wm_token_count`): sampling N recipes reads N P prompt tokens and generates
N S tokens; without a KV cache it runs S full forwards of length P + S, i.e.
N S (P + S) token positions. A WM call runs one forward of N (P + S + 1)
tokens and generates nothing.

Example:
    >>> vocab = RecipeVocab(slot_sizes=(4, 8, 3, 3))
    >>> model = models.random_model(make_backbone(vocab), jax.random.key(0))
    >>> out = sample_recipes(model.graphdef, model.params, prompts, key, vocab=vocab)
    >>> mean, var, mass = wm_predict(model.graphdef, model.params, prompts, out.tokens,
    ...                              vocab=vocab)
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from wmrl_jax.agents.recipe.vocab import (  # noqa: F401  (re-exported)
    RecipeVocab,
    all_recipe_tokens,
    recipe_from_tokens,
    recipes_from_tokens,
    slots_from_tokens,
    task_prompt,
    tokens_from_recipes,
)
from wmrl_jax.models import qwen3
from wmrl_jax.models.api import qwen3_config_dict
from wmrl_jax.worldmodel.readout import score_bin_readout


class RecipeSample(NamedTuple):
    """Sampled recipes.

    Attributes:
        tokens: int32 [N, S] recipe tokens (slot s from slot s's range).
        logprobs: float32 [N, S] full-vocabulary log-softmax (temperature 1) of
            each sampled token, as a teacher-forced forward computes it.
    """

    tokens: jax.Array
    logprobs: jax.Array


class TokenCount(NamedTuple):
    """Tokens one call processes: prompt tokens read, tokens generated, and token
    positions run through the backbone (the FLOP-relevant count)."""

    prompt: int
    generated: int
    forward: int


def sample_token_count(num: int, vocab: RecipeVocab) -> TokenCount:
    """Tokens processed by `sample_recipes` on `num` prompts."""
    p, s = vocab.prompt_length, vocab.num_slots
    return TokenCount(prompt=num * p, generated=num * s, forward=num * s * (p + s))


def wm_token_count(num: int, vocab: RecipeVocab) -> TokenCount:
    """Tokens processed by `wm_predict` on `num` (prompt, recipe) pairs."""
    n = num * (vocab.prompt_length + vocab.num_slots + 1)
    return TokenCount(prompt=n, generated=0, forward=n)


def _check_prompts(prompts, vocab: RecipeVocab) -> None:
    if prompts.ndim != 2 or prompts.shape[1] != vocab.prompt_length:
        raise ValueError(
            f"prompts must have shape [N, {vocab.prompt_length}] (prompt length mismatch), "
            f"got {prompts.shape}"
        )


def _vocab(vocab: RecipeVocab | None) -> RecipeVocab:
    return RecipeVocab() if vocab is None else vocab


def _check_vocab_size(logits, vocab: RecipeVocab) -> None:
    if logits.shape[-1] != vocab.size:
        raise ValueError(
            f"the backbone has {logits.shape[-1]} output tokens but the vocabulary has "
            f"{vocab.size}; build it with make_backbone(vocab)"
        )


def _check_recipes(recipe_tokens, n: int, vocab: RecipeVocab, name: str = "recipe_tokens"):
    if recipe_tokens.shape != (n, vocab.num_slots):
        raise ValueError(
            f"{name} must have shape [{n}, {vocab.num_slots}], got {recipe_tokens.shape}"
        )


@functools.partial(jax.jit, static_argnames=("graphdef", "vocab", "greedy"))
def sample_recipes(
    graphdef,
    params,
    prompts,
    key,
    *,
    vocab: RecipeVocab | None = None,
    temperature=1.0,
    greedy: bool = False,
) -> RecipeSample:
    """Samples one recipe per prompt, each slot restricted to its own tokens.

    Position P + s is drawn from softmax(logits / temperature) over slot s's
    tokens (argmax with `greedy`). S full forwards (no KV cache: S is tiny);
    see `sample_token_count`. Note the sampling distribution is the restricted
    one, while `logprobs` are full-vocabulary at temperature 1 (the train step's
    importance ratio is then exactly 1 before an update).

    Args:
        graphdef, params: split `Qwen3` over `vocab`.
        prompts: int [N, P] from `task_prompt`.
        key: PRNG key (unused when greedy).
        vocab: the `RecipeVocab` (static); None: `RecipeVocab()`.
        temperature: sampling temperature (> 0); pass it the same way (keyword or
            default) on every call to reuse one compilation.
        greedy: take the most likely slot token.

    Returns:
        `RecipeSample` of tokens int32 [N, S] and logprobs float32 [N, S].
    """
    vocab = _vocab(vocab)
    _check_prompts(prompts, vocab)
    n, p = prompts.shape
    s_len = vocab.num_slots
    slot_mask = jnp.asarray(vocab.slot_mask())
    tokens = jnp.concatenate(
        [prompts.astype(jnp.int32), jnp.full((n, s_len), vocab.pad, jnp.int32)], axis=1
    )

    def body(tokens, xs):
        s, step_key = xs
        # Causal attention: the pad placeholders after position P + s - 1 do not
        # affect the logits at that position.
        logits = qwen3.apply(graphdef, params, tokens)
        _check_vocab_size(logits, vocab)
        logits = jax.lax.dynamic_index_in_dim(logits, p + s - 1, axis=1, keepdims=False)
        allowed = slot_mask[s]
        masked = jnp.where(allowed, logits / temperature, -jnp.inf)
        if greedy:
            token = jnp.argmax(masked, axis=-1)
        else:
            token = jax.random.categorical(step_key, masked, axis=-1)
        logprob = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), token[:, None], 1)
        tokens = jax.lax.dynamic_update_index_in_dim(tokens, token.astype(jnp.int32), p + s, 1)
        return tokens, logprob[:, 0]

    keys = jax.random.split(key, s_len)
    tokens, logprobs = jax.lax.scan(body, tokens, (jnp.arange(s_len), keys))
    return RecipeSample(tokens=tokens[:, p:], logprobs=logprobs.T.astype(jnp.float32))


def policy_batch(prompts, sample: RecipeSample, advantages) -> dict:
    """The train-step batch for GRPO on sampled recipes.

    Args:
        prompts: int [N, P].
        sample: `RecipeSample` with tokens and logprobs of shape [N, S].
        advantages: float [N].

    Returns:
        dict with tokens int32 [N, P + S], attention_mask int32 [N, P + S] (all
        ones), loss_mask float32 [N, P + S] (1 on the S recipe positions),
        old_logprobs float32 [N, P + S] (sampling log-probs there, else 0) and
        advantages float32 [N].
    """
    prompts = jnp.asarray(prompts)
    tokens, logprobs = jnp.asarray(sample.tokens), jnp.asarray(sample.logprobs)
    advantages = jnp.asarray(advantages)
    if prompts.ndim != 2:
        raise ValueError(f"prompts must have shape [N, P], got {prompts.shape}")
    n, p = prompts.shape
    if tokens.ndim != 2 or tokens.shape[0] != n or logprobs.shape != tokens.shape:
        raise ValueError(
            f"sample tokens and logprobs must both have shape [{n}, S], got {tokens.shape} "
            f"and {logprobs.shape}"
        )
    if advantages.shape != (n,):
        raise ValueError(f"advantages must have shape [{n}], got {advantages.shape}")
    s = tokens.shape[1]
    is_recipe = jnp.concatenate([jnp.zeros((n, p)), jnp.ones((n, s))], axis=1)
    return {
        "tokens": jnp.concatenate([prompts, tokens], axis=1).astype(jnp.int32),
        "attention_mask": jnp.ones((n, p + s), jnp.int32),
        "loss_mask": is_recipe.astype(jnp.float32),
        "old_logprobs": jnp.concatenate([jnp.zeros((n, p)), logprobs], axis=1).astype(jnp.float32),
        "advantages": advantages.astype(jnp.float32),
    }


def wm_tokens(prompts, recipe_tokens, *, vocab: RecipeVocab) -> jax.Array:
    """WM input [prompt, recipe, PREDICT], int32 [N, P + S + 1]."""
    _check_prompts(prompts, vocab)
    _check_recipes(recipe_tokens, prompts.shape[0], vocab)
    marker = jnp.full((prompts.shape[0], 1), vocab.predict, jnp.int32)
    return jnp.concatenate(
        [prompts.astype(jnp.int32), recipe_tokens.astype(jnp.int32), marker], axis=1
    )


@functools.partial(jax.jit, static_argnames=("graphdef", "vocab"))
def wm_predict(
    graphdef, params, prompts, recipe_tokens, *, vocab: RecipeVocab | None = None, min_mass=0.05
):
    """World-model prediction of each recipe's reward (one forward; `wm_token_count`).

    Args:
        graphdef, params: split `Qwen3` over `vocab`.
        prompts: int [N, P].
        recipe_tokens: int [N, S].
        vocab: the `RecipeVocab` (static); None: `RecipeVocab()`.
        min_mass: below this probability on the bin tokens the variance is inf.

    Returns:
        (mean, variance, mass), float32 [N] each, on the reward scale (the
        failure bin counts at `vocab.failure_value`).
    """
    vocab = _vocab(vocab)
    logits = qwen3.apply(graphdef, params, wm_tokens(prompts, recipe_tokens, vocab=vocab))
    _check_vocab_size(logits, vocab)
    readout = functools.partial(score_bin_readout, min_mass=min_mass)
    return jax.vmap(readout, in_axes=(0, None, None))(
        logits[:, -1], jnp.asarray(vocab.bin_ids()), jnp.asarray(vocab.bin_values())
    )


def make_backbone(
    vocab: RecipeVocab,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int | None = None,
    head_dim: int = 16,
    intermediate_size: int | None = None,
    tie_word_embeddings: bool = False,
) -> dict:
    """Raw `config.json` dict of a tiny Qwen3 over `vocab` (for `models.random_model`).

    `num_kv_heads` defaults to half the heads (all of them when odd);
    `intermediate_size` to twice the hidden size.
    """
    if num_kv_heads is None:
        num_kv_heads = num_heads // 2 if num_heads % 2 == 0 else num_heads
    return qwen3_config_dict(
        vocab_size=vocab.size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        tie_word_embeddings=tie_word_embeddings,
    )


def group_softmax_weights(prompts, rewards, *, temperature: float) -> np.ndarray:
    """Per-prompt softmax of reward / temperature, float32 [K], summing to 1 within each
    group of identical prompts (prompts [K, P], rewards [K])."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    _, group = np.unique(np.asarray(prompts), axis=0, return_inverse=True)
    group = group.reshape(-1)
    z = np.asarray(rewards, np.float64) / temperature
    weights = np.zeros_like(z)
    for g in np.unique(group):
        sel = group == g
        e = np.exp(z[sel] - z[sel].max())
        weights[sel] = e / e.sum()
    return weights.astype(np.float32)


def warm_start_data(vocab: RecipeVocab, prompts, rewards):
    """Flat warm-start examples from a tabular benchmark (task x every recipe).

    Args:
        prompts: int [T, P], one prompt per task (`task_prompt`).
        rewards: float [T, R], R = prod(slot_sizes), recipes in `all_recipe_tokens`
            order (as `RecipeTable.reward(task_id, floors)` returns them); NaN
            entries (infra errors: no outcome) are dropped.

    Returns:
        (prompts int32 [K, P], recipe_tokens int32 [K, S], rewards float32 [K]).
    """
    prompts, rewards = np.asarray(prompts, np.int32), np.asarray(rewards, np.float32)
    _check_prompts(prompts, vocab)
    recipes = all_recipe_tokens(vocab)
    if rewards.shape != (prompts.shape[0], recipes.shape[0]):
        raise ValueError(
            f"rewards must have shape [{prompts.shape[0]}, {recipes.shape[0]}], got {rewards.shape}"
        )
    task, recipe = np.nonzero(np.isfinite(rewards))
    return prompts[task], recipes[recipe], rewards[task, recipe]


def sequence_losses(graphdef, params, tokens, bins, *, vocab: RecipeVocab):
    """Per-sequence losses on [prompt, recipe, PREDICT] sequences.

    Args:
        tokens: int [M, P + S + 1] from `wm_tokens`.
        bins: int [M], target bin index (0..B) of each sequence's reward.

    Returns:
        (bc [M]: summed full-vocabulary NLL of the S recipe tokens, wm [M]: NLL of
        the bin token after PREDICT), float32.
    """
    p, s = vocab.prompt_length, vocab.num_slots
    logits = qwen3.apply(graphdef, params, tokens)
    recipe_logp = qwen3.token_logprobs(logits[:, p - 1 : p + s - 1], tokens[:, p : p + s])
    bin_token = jnp.asarray(vocab.bin_ids())[bins]
    wm_logp = qwen3.token_logprobs(logits[:, -1:], bin_token[:, None])[:, 0]
    return -recipe_logp.sum(axis=1), -wm_logp


def warm_start(
    graphdef,
    params,
    data,
    *,
    vocab: RecipeVocab | None = None,
    steps: int,
    batch_size: int,
    lr: float,
    key,
    temperature: float = 0.1,
    wm_coef: float = 1.0,
):
    """Supervised pre-training of policy and WM on (task, recipe, reward) examples.

    Each step draws `batch_size` behaviour-cloning examples with probability
    proportional to their per-prompt softmax weight (`group_softmax_weights`,
    each distinct prompt counting equally; tasks with identical prompts share
    a group) and `batch_size` WM examples uniformly, and takes one Adam step on
    mean(bc) + wm_coef * mean(wm) (`sequence_losses`).
    One jitted `lax.scan` over the steps.

    Args:
        graphdef, params: split `Qwen3` over `vocab`.
        data: (prompts int [K, P], recipe_tokens int [K, S], rewards float [K]),
            e.g. from `warm_start_data`; rewards are percentiles in [0, 1] or
            negative failure floors (all floors train the one failure bin); NaN
            rewards (infra errors: no outcome) are dropped.
        vocab: the `RecipeVocab`; None: `RecipeVocab()`.
        steps, batch_size, lr: optimisation schedule.
        key: PRNG key.
        temperature: reward temperature of the behaviour-cloning weights.
        wm_coef: weight of the WM loss.

    Returns:
        (params, metrics) with metrics["bc_loss"], metrics["wm_loss"] float32 [steps]
        (the losses of each step's batch before its update).
    """
    vocab = _vocab(vocab)
    prompts, recipe_tokens, rewards = (np.asarray(a) for a in data)
    _check_prompts(prompts, vocab)
    k = prompts.shape[0]
    _check_recipes(recipe_tokens, k, vocab)
    if rewards.shape != (k,):
        raise ValueError(f"rewards must have shape [{k}], got {rewards.shape}")
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1, got {steps}, {batch_size}")
    keep = ~np.isnan(rewards.astype(np.float64))
    if not keep.any():
        raise ValueError("warm_start needs at least one example with a finite reward")
    prompts, recipe_tokens, rewards = prompts[keep], recipe_tokens[keep], rewards[keep]
    k = len(rewards)
    weights = group_softmax_weights(prompts, rewards, temperature=temperature)
    probs = jnp.asarray(weights / weights.sum())
    seqs = wm_tokens(jnp.asarray(prompts), jnp.asarray(recipe_tokens), vocab=vocab)
    bins = jnp.asarray(vocab.reward_to_bin(rewards))
    optimizer = optax.adam(lr)

    def loss_fn(params, idx_bc, idx_wm):
        idx = jnp.concatenate([idx_bc, idx_wm])
        bc, wm = sequence_losses(graphdef, params, seqs[idx], bins[idx], vocab=vocab)
        bc_loss, wm_loss = bc[:batch_size].mean(), wm[batch_size:].mean()
        return bc_loss + wm_coef * wm_loss, (bc_loss, wm_loss)

    def step(carry, step_key):
        params, opt_state = carry
        k_bc, k_wm = jax.random.split(step_key)
        idx_bc = jax.random.choice(k_bc, k, (batch_size,), p=probs)
        idx_wm = jax.random.randint(k_wm, (batch_size,), 0, k)
        grads, (bc_loss, wm_loss) = jax.grad(loss_fn, has_aux=True)(params, idx_bc, idx_wm)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), (bc_loss, wm_loss)

    @jax.jit
    def run(params, key):
        carry = (params, optimizer.init(params))
        (params, _), (bc, wm) = jax.lax.scan(step, carry, jax.random.split(key, steps))
        return params, {"bc_loss": bc, "wm_loss": wm}

    return run(params, key)
