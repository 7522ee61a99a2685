"""Per-token log-probs and entropies from the LM head, a block of tokens at a time.

A training pass that takes log-probs from full logits holds float32 [T, V] arrays
(the logits, their log-softmax, the entropy terms): ~5 GB each for one sequence
of 8,192 tokens over Qwen3's 151,936-token vocabulary, more than all the layers'
rematerialised activations together. `blocked_token_logprobs` maps over blocks
of `block` tokens; each block's logits exist only inside its step, and the step
is rematerialised (`jax.checkpoint`), so the backward pass rebuilds one block's
logits at a time from the features and the head (one extra head matmul).
Every row's log-softmax is still over the whole vocabulary: values are those of
`qwen3.token_logprobs` on the full logits.

Example:
    >>> features, head = qwen3.apply_features(graphdef, params, tokens, mask, remat=True)
    >>> logp, entropy = blocked_token_logprobs(features[:, :-1], head, tokens[:, 1:])
"""

import jax
import jax.numpy as jnp

from wmrl_jax.models import sharding

# Tokens per block: one block's float32 logits are block x V x 4 bytes per
# sequence (0.3 GB at V = 151,936), a few such arrays at a time.
TOKEN_BLOCK = 512


def _block_logprobs(features, head, targets):
    """log p(targets) and the predictive entropy for one block: [B, t, hidden] -> [B, t] x 2."""
    logits = jnp.dot(features, head, preferred_element_type=jnp.float32)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    logp = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    fixed = jax.lax.stop_gradient(log_probs)
    return logp, -jnp.sum(jnp.exp(fixed) * fixed, axis=-1)


def blocked_token_logprobs(features, head, targets, *, block: int = TOKEN_BLOCK):
    """Float32 log p(targets) and entropies of `features @ head`, in token blocks.

    Args:
        features: the LM head's input, of shape [B, T, hidden].
        head: the LM head, of shape [hidden, V].
        targets: int of shape [B, T].
        block: tokens per block (memory only; T is padded up to a multiple).

    Returns:
        (logp, entropy), each float32 of shape [B, T]; the entropy's gradient is
        stopped.
    """
    if features.ndim != 3 or targets.shape != features.shape[:2]:
        raise ValueError(f"features {features.shape} must be [B, T, hidden], targets [B, T]")
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    b, t, h = features.shape
    block = min(block, t)
    n = -(-t // block)
    pad = ((0, 0), (0, n * block - t))
    features = jnp.moveaxis(jnp.pad(features, (*pad, (0, 0))).reshape(b, n, block, h), 1, 0)
    targets = jnp.moveaxis(jnp.pad(targets, pad).reshape(b, n, block), 1, 0)

    head = sharding.gather_for_use({"lm_head": head})["lm_head"]  # FSDP: gathered once

    # Rematerialised: only the block's features are kept for the backward pass
    # (the head is a loop constant); its logits are rebuilt there.
    @jax.checkpoint
    def one(xs):
        return _block_logprobs(xs[0], head, xs[1])

    logp, entropy = jax.lax.map(one, (features, targets))  # each [n, B, block]

    def unblock(x):
        return jnp.moveaxis(x, 0, 1).reshape(b, n * block)[:, :t]

    return unblock(logp), unblock(entropy)
