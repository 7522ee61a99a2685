"""Jitted sampler: one prefill, then a `lax.while_loop` decode over a fixed-size cache.

Prompts are left padded to a common length P, so every row's next token lands in
the same cache slot (P + t) while rotary positions stay per row. The cache has
P + max_new_tokens slots; a slot is visible to a query when it holds a real
prompt token or an already generated one. The loop stops once every row has
emitted a stop token (EOS or a configured stop id) or the budget is spent.

The cache is whatever pytree the model's `init_cache` returns: a KV cache for
the dense Qwen3, per-layer KV caches, conv windows and recurrent states for the
hybrid Qwen3.5 (whose GDN layers carry their state forward token by token).

With `num_samples=K` each prompt is prefilled once and its cache copied for K
samples: a world model's K answers to one long prompt cost one prefill, not K.

Returned log-probs are those of the *unmodified* policy (temperature 1, no top-k
/ top-p truncation), in float32 — the quantity an importance ratio needs — so they
agree with a teacher-forced forward pass on the same tokens.
"""

import functools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from wmrl_jax.models.qwen3 import positions_from_mask
from wmrl_jax.models.sharding import cache_spec, mesh_context


class SampleOutput(NamedTuple):
    """Sampler results.

    Attributes:
        tokens: int32 of shape [B, N]; `pad_id` after a row stopped.
        logprobs: float32 of shape [B, N]; log p(token) under the untempered
            policy, 0 where `mask` is 0.
        mask: int32 of shape [B, N]; 1 for generated tokens (stop token included).
        lengths: int32 of shape [B]; number of generated tokens per row.
    """

    tokens: jax.Array
    logprobs: jax.Array
    mask: jax.Array
    lengths: jax.Array


def filter_logits(logits: jax.Array, *, temperature: float, top_k: int, top_p: float):
    """Tempered logits with everything outside the top-k / nucleus set to -inf.

    Args:
        logits: float32 of shape [B, V].
        temperature: > 0.
        top_k: keep the k largest (0 = all).
        top_p: keep the smallest set with probability mass >= top_p (1 = all).

    Returns:
        float32 of shape [B, V].
    """
    logits = logits.astype(jnp.float32) / np.float32(temperature)
    neg = jnp.float32(-jnp.inf)
    if top_k and top_k < logits.shape[-1]:
        kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
        logits = jnp.where(logits < kth, neg, logits)
    if top_p < 1.0:
        ordered = jnp.sort(logits, axis=-1)[:, ::-1]
        cum = jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1)
        # Keep a token if the mass strictly before it is below top_p (the top one always).
        keep = (cum - jax.nn.softmax(ordered, axis=-1)) < top_p
        cutoff = jnp.min(jnp.where(keep, ordered, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < cutoff, neg, logits)
    return logits


@functools.partial(
    jax.jit,
    static_argnames=(
        "graphdef",
        "max_new_tokens",
        "temperature",
        "top_k",
        "top_p",
        "greedy",
        "stop_ids",
        "pad_id",
        "mesh",
        "num_samples",
    ),
)
def _sample(
    graphdef,
    params,
    prompt_ids,
    prompt_mask,
    key,
    *,
    max_new_tokens,
    temperature,
    top_k,
    top_p,
    greedy,
    stop_ids,
    pad_id,
    mesh,
    num_samples=1,
):
    model = nnx.merge(graphdef, params)
    b, p = prompt_ids.shape
    n = max_new_tokens
    slots = p + n
    dtype = model.embed_tokens[...].dtype

    def place(cache):
        if mesh is None:
            return cache
        return jax.tree_util.tree_map(
            lambda x: jax.lax.with_sharding_constraint(
                x, NamedSharding(mesh, cache_spec(x.shape, mesh))
            ),
            cache,
        )

    # Each layer gathers its weights where it is used and the batch stays split (FSDP).
    with mesh_context(mesh):
        cache = place(model.init_cache(b, slots, dtype))
        prompt_mask = prompt_mask.astype(bool)
        slot = jnp.arange(slots)
        prompt_slots = jnp.pad(prompt_mask, ((0, 0), (0, n)))  # [B, S]
        mask = (slot[None, :] <= jnp.arange(p)[:, None])[None] & prompt_slots[:, None, :]
        positions = positions_from_mask(prompt_mask)
        logits, cache = model(prompt_ids, positions, mask, cache, 0, last_only=True)
        n_prompt = jnp.sum(prompt_mask, axis=-1).astype(jnp.int32)
        if num_samples > 1:  # one prefill per prompt; its cache copied for each sample
            logits, prompt_slots, n_prompt = (
                jnp.repeat(x, num_samples, axis=0) for x in (logits, prompt_slots, n_prompt)
            )
            cache = place(jax.tree_util.tree_map(lambda x: jnp.repeat(x, num_samples, 0), cache))
            b = b * num_samples
        stops = jnp.asarray(stop_ids if stop_ids else (-1,), jnp.int32)

        def cond(state):
            t, _, _, _, _, _, done = state
            return (t < n) & ~jnp.all(done)

        def body(state):
            t, cache, last, tokens, logps, live, done = state
            if greedy:
                token = jnp.argmax(last, axis=-1).astype(jnp.int32)
            else:
                filtered = filter_logits(last, temperature=temperature, top_k=top_k, top_p=top_p)
                token = jax.random.categorical(jax.random.fold_in(key, t), filtered).astype(
                    jnp.int32
                )
            logp = jnp.take_along_axis(jax.nn.log_softmax(last, axis=-1), token[:, None], axis=-1)[
                :, 0
            ]
            token = jnp.where(done, pad_id, token)
            tokens = tokens.at[:, t].set(token)
            logps = logps.at[:, t].set(jnp.where(done, 0.0, logp))
            live = live.at[:, t].set(~done)
            done = done | jnp.any(token[:, None] == stops[None, :], axis=-1)
            visible = prompt_slots | ((slot >= p) & (slot <= p + t))[None, :]
            step_logits, cache = model(
                token[:, None], (n_prompt + t)[:, None], visible[:, None, :], cache, p + t
            )
            return t + 1, cache, step_logits[:, 0], tokens, logps, live, done

        state = (
            jnp.int32(0),
            cache,
            logits[:, -1],
            jnp.full((b, n), pad_id, jnp.int32),
            jnp.zeros((b, n), jnp.float32),
            jnp.zeros((b, n), bool),
            jnp.zeros((b,), bool),
        )
        _, _, _, tokens, logps, live, _ = jax.lax.while_loop(cond, body, state)
    live = live.astype(jnp.int32)
    return SampleOutput(tokens, logps, live, jnp.sum(live, axis=-1))


def sample(
    model,
    prompt_ids,
    prompt_mask,
    key: jax.Array,
    *,
    max_new_tokens: int,
    params=None,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    greedy: bool = False,
    eos_ids: Sequence[int] | None = None,
    stop_ids: Sequence[int] = (),
    pad_id: int = 0,
    mesh: Mesh | None = None,
    num_samples: int = 1,
) -> SampleOutput:
    """Samples completions for a left-padded batch of prompts.

    Args:
        model: a `wmrl_jax.models.Model`.
        prompt_ids: int of shape [B, P], left padded; every row has >= 1 token.
        prompt_mask: of shape [B, P]; 1 for real tokens.
        key: PRNG key; the same key gives the same samples.
        max_new_tokens: decode budget N.
        params: optional params state overriding `model.params` (e.g. the
            current policy inside a training loop).
        temperature, top_k, top_p: sampling filters (ignored when `greedy`).
        greedy: take the argmax.
        eos_ids: stop tokens; defaults to the config's `eos_token_id`.
        stop_ids: extra stop tokens.
        pad_id: token written after a row stopped.
        mesh: optional mesh; every cache array is sharded with `cache_spec`.
        num_samples: K completions per prompt from ONE prefill of it: the prompt's
            cache is copied K times after the prefill, so K samples cost one
            prompt's prefill instead of K. Rows come out as `np.repeat(prompts, K)`
            would order them (row i K + j: sample j of prompt i), with the same
            samples as those repeated prompts under the same key.

    Returns:
        A `SampleOutput` with arrays of shape [B K, N].

    Example:
        >>> ids, mask = left_pad([[1, 2, 3], [4]], pad_id=0)
        >>> out = sample(model, ids, mask, jax.random.key(0), max_new_tokens=16, top_p=0.9)
    """
    prompt_ids = jnp.asarray(prompt_ids, jnp.int32)
    prompt_mask = jnp.asarray(prompt_mask, jnp.int32)
    if prompt_ids.ndim != 2 or prompt_mask.shape != prompt_ids.shape:
        raise ValueError(f"prompt_ids {prompt_ids.shape} and prompt_mask must be [B, P]")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not greedy and temperature <= 0:
        raise ValueError(f"temperature must be > 0 (or greedy=True), got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    eos = model.config.eos_token_id if eos_ids is None else tuple(eos_ids)
    stops = tuple(sorted({int(i) for i in (*eos, *stop_ids)}))
    return _sample(
        model.graphdef,
        model.params if params is None else params,
        prompt_ids,
        prompt_mask,
        key,
        max_new_tokens=int(max_new_tokens),
        temperature=float(temperature),
        top_k=int(top_k),
        top_p=float(top_p),
        greedy=bool(greedy),
        stop_ids=stops,
        pad_id=int(pad_id),
        mesh=mesh,
        num_samples=int(num_samples),
    )
