"""A world-model readout over dedicated score-bin tokens, for small models.

A small backbone that writes recipes cannot be asked for free-form JSON. It
is trained instead to emit, after a "predict" marker, one of B dedicated
tokens, bin b standing for percentile `values[b]` (e.g. bin centres of
[0, 1]). The prediction is read off the next-token distribution restricted to
those tokens, with no sampling:

    p_b = softmax(logits[bin_ids])_b,   mean = sum_b p_b v_b,
    variance = sum_b p_b (v_b - mean)^2.

When the model puts little probability on the bin tokens at all (the
marker was not followed as trained), the readout reports an infinite
variance: the reward correction then treats it as "no prediction".
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def bin_centres(num_bins: int) -> jax.Array:
    """Centres of `num_bins` equal bins of [0, 1], of shape [num_bins].

    Example:
      >>> bin_centres(4).tolist()
      [0.125, 0.375, 0.625, 0.875]
    """
    if num_bins < 1:
        raise ValueError(f"num_bins must be >= 1, got {num_bins}")
    return (jnp.arange(num_bins, dtype=jnp.float32) + 0.5) / num_bins


def score_bin_readout(
    logits: jax.Array,
    bin_ids: jax.Array,
    values: jax.Array,
    *,
    min_mass: float = 0.05,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Expected score and its variance from next-token logits over bin tokens.

    Args:
      logits: next-token logits at the position after the marker, of shape
        [V] (any float dtype; computed in float32). Batch with `jax.vmap`.
      bin_ids: int token ids of the B bin tokens, of shape [B].
      values: the score each bin stands for, of shape [B].
      min_mass: below this total probability on the bin tokens (under the full
        softmax), the variance is infinite (unusable prediction).

    Returns:
      `(mean, variance, mass)`: float32 scalars; `mass` is the probability the
      model put on the bin tokens at all.

    Example:
      >>> logits = jnp.array([0.0, 5.0, 5.0, -9.0])
      >>> mean, var, mass = score_bin_readout(logits, jnp.array([1, 2]), jnp.array([0.25, 0.75]))
      >>> float(mean), float(var)
      (0.5, 0.0625)
    """
    logits = jnp.asarray(logits, jnp.float32)
    bin_ids = jnp.asarray(bin_ids)
    values = jnp.asarray(values, jnp.float32)
    if logits.ndim != 1:
        raise ValueError(f"logits must have shape [V] (vmap for batches), got {logits.shape}")
    if bin_ids.ndim != 1 or values.shape != bin_ids.shape:
        raise ValueError(
            f"bin_ids and values must both have shape [B], got {bin_ids.shape} and {values.shape}"
        )
    if not jnp.issubdtype(bin_ids.dtype, jnp.integer):
        raise ValueError(f"bin_ids must be integer token ids, got {bin_ids.dtype}")
    log_z = jax.nn.logsumexp(logits)
    bin_logits = logits[bin_ids]
    mass = jnp.exp(jax.nn.logsumexp(bin_logits) - log_z)
    probs = jax.nn.softmax(bin_logits)
    mean = jnp.sum(probs * values)
    variance = jnp.sum(probs * (values - mean) ** 2)
    return mean, jnp.where(mass >= min_mass, variance, jnp.inf), mass
