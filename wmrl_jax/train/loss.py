"""The exact whole-batch GRPO loss of a Qwen3 policy, and its gradient, by micro-batches.

`loss_and_grads` cuts the batch into ``num_microbatches`` micro-batches,
accumulates gradients in float32 with a ``lax.scan``, and rescales every
micro-batch's `core.grpo.grpo_loss` so that the sum is exactly the loss of the
whole batch (the global token mean, not a mean of micro-batch means). The
importance ratio is taken against the sampling log-probs in the batch. With
``remat=True`` in the step config every layer is rematerialised in the backward
pass and the LM head runs in token blocks (`sequence_logprobs`): the same loss
and gradients in a fraction of the memory, for about a third more compute.
`wmrl_jax.train.step` jits this, with the optimizer update, into the sharded
train step.

Batch (dict of arrays, B sequences of T tokens; other keys are ignored):
  tokens int32 [B, T]; attention_mask int32 [B, T] (1 = real token, left
  padding allowed); loss_mask float32 [B, T] (1 on sampled completion tokens;
  the log-prob of position t comes from the logits at t - 1, so column 0 is
  never a loss token); old_logprobs float32 [B, T]; advantages float32 [B].

Example:
    >>> config = step.default_step_config()
    >>> loss, grads, metrics = loss_and_grads(graphdef, params, batch, config=config)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from wmrl_jax.core import grpo
from wmrl_jax.models import lm_head, lora, qwen3, sharding
from wmrl_jax.models.sharding import BATCH
from wmrl_jax.train import state as state_lib

__all__ = [
    "AUX_SPEC",
    "BATCH_SPEC",
    "COMPUTE_DTYPES",
    "batch_spec",
    "check_batch",
    "loss_and_grads",
    "sequence_logprobs",
    "split_microbatches",
]

BATCH_SPEC = {
    "tokens": (2, jnp.int32),
    "attention_mask": (2, jnp.int32),
    "loss_mask": (2, jnp.float32),
    "old_logprobs": (2, jnp.float32),
    "advantages": (1, jnp.float32),
}
# Optional auxiliary next-token loss (e.g. the world model's score-bin token on executed
# anchors, so the backbone that writes solutions keeps predicting their outcome):
# `aux_mask` marks the target tokens, aligned with `aux_tokens`; on when loss.aux_coef != 0.
AUX_SPEC = {"aux_tokens": (2, jnp.int32), "aux_mask": (2, jnp.float32)}


def batch_spec(config) -> dict:
    """The batch keys this step config reads: `BATCH_SPEC`, plus `AUX_SPEC` when on."""
    return {**BATCH_SPEC, **(AUX_SPEC if _aux_coef(config) else {})}


def _aux_coef(config) -> float:
    return float(config.loss.get("aux_coef", 0.0) or 0.0)


COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
# Token-mean metrics of grpo_loss, recombined across micro-batches by token counts.
_TOKEN_MEANS = ("pg_loss", "kl", "clip_frac", "ratio_mean", "adv_mean")


def sequence_logprobs(
    graphdef, params, tokens, attention_mask, *, compute_dtype=None, remat: bool = False
):
    """Per-token log-probs and entropies of a batch under ``params``, in float32.

    Position t holds ``log p(tokens[:, t] | tokens[:, :t])`` from the logits at
    t - 1; column 0 has no prediction and holds 0.

    With ``remat`` the values and gradients are the same, at a fraction of the
    memory: each layer is rematerialised in the backward pass
    (`qwen3.layer_call`, the layers under `lax.scan`: `models.layer_scan`) and the LM
    head runs in token blocks
    (`lm_head.blocked_token_logprobs`), so no [T, V] logits are ever whole.

    Args:
      graphdef: `nnx.GraphDef` of a Qwen3.
      params: its params pytree; cast to ``compute_dtype`` (if set) for the forward.
      tokens: int32 of shape [B, T].
      attention_mask: int32 of shape [B, T].
      compute_dtype: None (params dtype) or a jnp dtype.
      remat: per-layer remat and a blocked LM head (memory, not values).

    Returns:
      ``(logp, entropy)``, each float32 of shape [B, T]; ``entropy`` is the
      entropy of the predictive distribution at t - 1, gradient stopped.
    """
    if compute_dtype is not None:
        params = jax.tree_util.tree_map(lambda p: p.astype(compute_dtype), params)
    if remat:
        features, head = qwen3.apply_features(graphdef, params, tokens, attention_mask, remat=True)
        logp, entropy = lm_head.blocked_token_logprobs(features[:, :-1], head, tokens[:, 1:])
    else:
        logits = qwen3.apply(graphdef, params, tokens, attention_mask)[:, :-1]
        logp = qwen3.token_logprobs(logits, tokens[:, 1:])
        log_probs = jax.nn.log_softmax(jax.lax.stop_gradient(logits).astype(jnp.float32), -1)
        entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
    pad = ((0, 0), (1, 0))
    return jnp.pad(logp, pad), jnp.pad(entropy, pad)


def _valid(loss_mask):
    """Loss tokens as bool [B, T]; column 0 has no log-prob and never counts."""
    return (loss_mask > 0).at[:, 0].set(False)


def _weights(valid, aggregation: str):
    """Per-sequence weights [B] whose batch sum is the loss denominator.

    Summing ``loss_mb * sum(weights_mb) / sum(weights)`` over micro-batches gives
    the whole batch's `grpo.aggregate` exactly: tokens (token_mean), non-empty
    sequences (seq_mean_token_mean) or sequences (seq_sum_norm).
    """
    tokens = jnp.sum(valid, axis=-1).astype(jnp.float32)
    if aggregation == "token_mean":
        return tokens
    if aggregation == "seq_mean_token_mean":
        return (tokens > 0).astype(jnp.float32)
    return jnp.ones_like(tokens)


def _micro_loss(params, mb, *, graphdef, config, dtype, total_weight, total_aux, frozen):
    """One micro-batch's share of the whole-batch loss, and its metrics."""
    c, aux_coef = config.loss, _aux_coef(config)
    params = params if frozen is None else lora.combine(params, frozen)
    remat = bool(config.get("remat", False))
    logp, entropy = sequence_logprobs(
        graphdef, params, mb["tokens"], mb["attention_mask"], compute_dtype=dtype, remat=remat
    )
    ok = _valid(mb["loss_mask"])
    loss, metrics = grpo.grpo_loss(
        logp,
        mb["old_logprobs"],
        mb.get("ref_logprobs"),
        mb["advantages"],
        ok,
        clip_low=c.clip_low,
        clip_high=c.clip_high,
        kl_coef=c.kl_coef,
        kl_estimator=c.kl_estimator,
        aggregation=c.aggregation,
        norm_constant=c.get("norm_constant") if c.aggregation == "seq_sum_norm" else None,
    )
    # grpo_loss divides by max(weight_mb, 1); a weight-0 micro-batch has loss 0.
    scale = jnp.maximum(jnp.sum(_weights(ok, c.aggregation)), 1.0) / total_weight
    tokens = jnp.sum(ok).astype(jnp.float32)
    metrics["entropy"] = jnp.sum(jnp.where(ok, entropy, 0.0)) / jnp.maximum(tokens, 1.0)
    metrics["tokens"] = tokens
    loss = loss * scale
    if aux_coef:  # Normalised by the whole batch's aux targets: an exact global mean.
        aux_logp, _ = sequence_logprobs(
            graphdef, params, mb["aux_tokens"], jnp.ones_like(mb["aux_tokens"]),
            compute_dtype=dtype, remat=remat,
        )  # fmt: skip
        aux_nll = -jnp.sum(mb["aux_mask"] * aux_logp) / total_aux
        metrics["aux_nll"] = aux_nll
        loss = loss + aux_coef * aux_nll
    return loss, metrics


def _zero_sums(aux: bool) -> dict:
    sums = {k: jnp.zeros((), jnp.float32) for k in ("loss", *_TOKEN_MEANS, "entropy")}
    sums |= {"ratio_min": jnp.float32(1e30), "ratio_max": jnp.float32(-1e30)}
    if aux:
        sums["aux_nll"] = jnp.zeros((), jnp.float32)
    return sums


def _add_metrics(sums: dict, loss, metrics: dict, total_tokens) -> dict:
    """Running whole-batch metrics: token means weighted by each micro-batch's tokens."""
    share = metrics["tokens"] / jnp.maximum(total_tokens, 1.0)
    seen = metrics["tokens"] > 0
    return {
        **({"aux_nll": sums["aux_nll"] + metrics["aux_nll"]} if "aux_nll" in sums else {}),
        "loss": sums["loss"] + loss,
        **{k: sums[k] + metrics[k] * share for k in (*_TOKEN_MEANS, "entropy")},
        "ratio_min": jnp.minimum(sums["ratio_min"], jnp.where(seen, metrics["ratio_min"], 1e30)),
        "ratio_max": jnp.maximum(sums["ratio_max"], jnp.where(seen, metrics["ratio_max"], -1e30)),
    }


def loss_and_grads(graphdef, params, batch, *, config, ref_logprobs=None, mesh=None, frozen=None):
    """Exact whole-batch GRPO loss, float32 gradient and metrics, by micro-batches.

    Args:
      graphdef: `nnx.GraphDef` of a Qwen3.
      params: the params differentiated (all of them, or a model's LoRA adapters).
      batch: the train batch (see the module docstring), B divisible by
        ``config.num_microbatches``.
      config: step config (`wmrl_jax.train.step.default_step_config`).
      ref_logprobs: reference log-probs float32 [B, T]; required when
        ``config.loss.kl_coef`` is non-zero.
      mesh: optional mesh; micro-batches then stay split over ("data", "fsdp").
      frozen: the rest of the model when ``params`` are its adapters
        (`models.lora.partition`); no gradient is taken with respect to it.

    Returns:
      ``(loss, grads, metrics)``: float32 scalar, float32 grads with the
      structure of ``params``, and a dict of float32 scalars (see `step.TrainStep`).
    """
    c = config.loss
    if c.kl_coef != 0 and ref_logprobs is None:
        raise ValueError("ref_logprobs are required when loss.kl_coef != 0.")
    aux_coef = _aux_coef(config)
    data = {k: batch[k] for k in batch_spec(config)}
    if c.kl_coef != 0:
        data["ref_logprobs"] = ref_logprobs
    valid = _valid(data["loss_mask"])
    total_tokens = jnp.sum(valid).astype(jnp.float32)
    micro_loss = functools.partial(
        _micro_loss,
        graphdef=graphdef,
        config=config,
        dtype=COMPUTE_DTYPES.get(config.get("compute_dtype")),
        total_weight=jnp.maximum(jnp.sum(_weights(valid, c.aggregation)), 1.0),
        total_aux=jnp.maximum(jnp.sum(data["aux_mask"]), 1.0) if aux_coef else None,
        frozen=frozen,
    )

    def body(carry, mb):
        grads, sums = carry
        (loss, metrics), g = jax.value_and_grad(micro_loss, has_aux=True)(params, mb)
        grads = jax.tree_util.tree_map(lambda a, b: a + b.astype(jnp.float32), grads, g)
        return (grads, _add_metrics(sums, loss, metrics, total_tokens)), None

    zeros = jax.tree_util.tree_map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    if mesh is not None:
        zeros = jax.lax.with_sharding_constraint(zeros, state_lib.tree_shardings(zeros, mesh))
    micro = split_microbatches(data, config.num_microbatches, mesh)
    # The mesh in context: each layer gathers its weights, not the batch (FSDP).
    with sharding.mesh_context(mesh):
        (grads, sums), _ = jax.lax.scan(body, (zeros, _zero_sums(bool(aux_coef))), micro)
    any_valid = total_tokens > 0
    sums["ratio_min"] = jnp.where(any_valid, sums["ratio_min"], 1.0)
    sums["ratio_max"] = jnp.where(any_valid, sums["ratio_max"], 1.0)
    sums["tokens"] = total_tokens
    return sums["loss"], grads, sums


def split_microbatches(data: dict, num_microbatches: int, mesh: Mesh | None = None) -> dict:
    """[B, ...] arrays -> [M, B / M, ...]; micro-batch i holds rows i, i + M, i + 2M, ...

    Strided rows (not contiguous blocks) keep every micro-batch spread over all
    batch shards: with B split over D devices in contiguous blocks and M | B / D,
    each device holds B / (M D) rows of every micro-batch, so no data moves.
    """

    def split(x):
        b = x.shape[0]
        x = x.reshape(b // num_microbatches, num_microbatches, *x.shape[1:]).swapaxes(0, 1)
        if mesh is not None:
            spec = PartitionSpec(None, BATCH, *([None] * (x.ndim - 2)))
            x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
        return x

    return {k: split(v) for k, v in data.items()}


def check_batch(batch, *, num_microbatches: int, batch_shards: int = 1, spec=None) -> None:
    """Raises ValueError unless ``batch`` has the train-batch layout and divisible B."""
    spec = BATCH_SPEC if spec is None else spec
    missing = [k for k in spec if k not in batch]
    if missing:
        raise ValueError(f"batch is missing {missing}; expected keys {sorted(spec)}.")
    b, t = np.shape(batch["tokens"])[:2] if np.ndim(batch["tokens"]) == 2 else (None, None)
    if b is None:
        raise ValueError(f"tokens must have shape [B, T], got {np.shape(batch['tokens'])}.")
    for key, (rank, _) in BATCH_SPEC.items():
        want = (b, t) if rank == 2 else (b,)
        if tuple(np.shape(batch[key])) != want:
            raise ValueError(f"{key} must have shape {want}, got {tuple(np.shape(batch[key]))}.")
    if t < 2:
        raise ValueError(f"sequences need T >= 2 tokens (a prefix and a target), got T={t}.")
    if "aux_tokens" in spec:
        aux = np.shape(batch["aux_tokens"])
        if len(aux) != 2 or aux[0] != b or np.shape(batch["aux_mask"]) != aux:
            raise ValueError(
                f"aux_tokens and aux_mask must both have shape [B={b}, L], got {aux} and "
                f"{np.shape(batch['aux_mask'])}."
            )
    if b % (num_microbatches * batch_shards):
        raise ValueError(
            f"batch size {b} is not divisible by num_microbatches x batch shards "
            f"(data x fsdp) = {num_microbatches} x {batch_shards}."
        )
