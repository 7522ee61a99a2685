"""Train state, optimizer and their placement on a (data, fsdp, tensor) mesh.

The whole of what a GRPO step carries is one pytree, `TrainState`: the policy
params, the optax state, the frozen reference params (None when the KL weight is
0, so no memory and no forward pass is spent on them), the step counter, and
``extra`` -- whatever else the loop checkpoints with the model (the reward
correction state, the compute ledger, the RNG key), which the train step passes
through untouched.

    optimizer = make_optimizer(config.optimizer)
    state = init_train_state(model.params, optimizer, kl_coef=0.04, extra={"rng": key})
    state = shard_state(state, mesh)        # params by the model's partition rules

With LoRA adapters in the params (`wmrl_jax.models.lora.attach`), the model's
weights are frozen and only the adapters train: ``params`` still holds the whole
model (the base once, plus the adapters, so the sampler reads it as it is), the
optimizer state covers the adapters alone (`trainable`), the train step
differentiates with respect to them only, there is no ``ref_params`` copy (the
reference is the base, `lora.base_only`), and a checkpoint holds the adapters
alone (`checkpoint_view`, `from_checkpoint`).

The optimizer is AdamW with decoupled weight decay (matrices only), a learning
rate schedule (linear warm-up, then cosine or linear decay to ``lr * end_lr_ratio``)
and global-norm gradient clipping, in that order: clip, then Adam.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from wmrl_jax.models import lora, sharding

DECAY_MODES = ("cosine", "linear")


class TrainState(struct.PyTreeNode):
    """Everything a train step reads and writes, as one pytree.

    Attributes:
      step: int32 scalar, the number of `train_step` calls so far (an optimizer
        update happens once per policy epoch, so the optimizer's own count is
        ``step * num_epochs``).
      params: policy params (an ``nnx.State`` or its pure dict); with LoRA, the
        frozen base and the adapters.
      opt_state: optax state of the optimizer, over `trainable(params)`.
      ref_params: frozen reference params with the structure of ``params``, or
        None when the KL weight is 0 or the params hold adapters (the reference
        is then the base itself).
      extra: any pytree the loop carries (correction state, ledger, rng);
        passed through the train step untouched.
    """

    step: jax.Array
    params: Any
    opt_state: Any
    ref_params: Any = None
    extra: Any = None


def default_optimizer_config() -> ml_collections.ConfigDict:
    """The optimizer fields `make_optimizer` reads, with common GRPO defaults."""
    return ml_collections.ConfigDict(
        dict(
            lr=1e-6,
            warmup_steps=0,
            total_steps=1000,
            end_lr_ratio=0.1,
            decay="cosine",
            weight_decay=0.0,
            b1=0.9,
            b2=0.999,
            eps=1e-8,
            clip_norm=1.0,
        )
    )


def _check_optimizer_config(c) -> None:
    problems = []
    if not c.lr > 0:
        problems.append(f"lr must be > 0, got {c.lr}")
    if c.warmup_steps < 0 or c.total_steps < 1 or c.warmup_steps > c.total_steps:
        problems.append(
            f"need 0 <= warmup_steps <= total_steps and total_steps >= 1, got "
            f"{c.warmup_steps} and {c.total_steps}"
        )
    if not 0.0 <= c.end_lr_ratio <= 1.0:
        problems.append(f"end_lr_ratio must lie in [0, 1], got {c.end_lr_ratio}")
    if c.get("decay", "cosine") not in DECAY_MODES:
        problems.append(f"decay must be one of {DECAY_MODES}, got {c.decay!r}")
    if c.weight_decay < 0:
        problems.append(f"weight_decay must be >= 0, got {c.weight_decay}")
    if not (0.0 <= c.b1 < 1.0 and 0.0 <= c.b2 < 1.0) or c.eps < 0:
        problems.append(f"need b1, b2 in [0, 1) and eps >= 0, got {c.b1}, {c.b2}, {c.eps}")
    if c.clip_norm is not None and not c.clip_norm > 0:
        problems.append(f"clip_norm must be > 0 or None, got {c.clip_norm}")
    if problems:
        raise ValueError("bad optimizer config: " + "; ".join(problems) + ".")


def make_schedule(config) -> optax.Schedule:
    """Learning rate per optimizer update ``count`` (0-based).

    Warm-up ``lr * (count + 1) / warmup_steps`` for ``count < warmup_steps`` (the
    first update is never wasted at lr 0), then from ``lr`` to
    ``end = lr * end_lr_ratio`` over the remaining ``total_steps - warmup_steps``
    updates: cosine ``end + (lr - end) (1 + cos(pi p)) / 2`` or linear
    ``lr + (end - lr) p``, with progress ``p`` clipped to [0, 1].

    Example:
      >>> c = default_optimizer_config(); c.lr, c.warmup_steps, c.total_steps = 1.0, 2, 4
      >>> [round(float(make_schedule(c)(i)), 3) for i in range(5)]
      [0.5, 1.0, 1.0, 0.55, 0.1]
    """
    _check_optimizer_config(config)
    lr, warmup = float(config.lr), int(config.warmup_steps)
    end = lr * float(config.end_lr_ratio)
    decay_steps = max(int(config.total_steps) - warmup, 1)
    cosine = config.get("decay", "cosine") == "cosine"

    def schedule(count):
        count = jnp.asarray(count, jnp.float32)
        warm = lr * (count + 1.0) / max(warmup, 1)
        progress = jnp.clip((count - warmup) / decay_steps, 0.0, 1.0)
        if cosine:
            decayed = end + (lr - end) * 0.5 * (1.0 + jnp.cos(math.pi * progress))
        else:
            decayed = lr + (end - lr) * progress
        return jnp.where(count < warmup, warm, decayed)

    return schedule


def _is_matrix(params):
    return jax.tree_util.tree_map(lambda x: x.ndim >= 2, params)


def make_optimizer(config) -> optax.GradientTransformation:
    """AdamW with a warm-up/decay schedule and global-norm clipping.

    The learning rate is injected (``optax.inject_hyperparams``), so the state
    holds the rate of the last update (`current_lr`). Weight decay applies to
    matrices only, not to norm weights or biases.

    Args:
      config: fields ``lr, warmup_steps, total_steps, end_lr_ratio, decay
        ("cosine" | "linear"), weight_decay, b1, b2, eps, clip_norm`` (None: no
        clipping); see `default_optimizer_config`.

    Returns:
      An ``optax.GradientTransformation``.

    Raises:
      ValueError: on out-of-range fields.
    """
    schedule = make_schedule(config)
    adamw = optax.inject_hyperparams(
        optax.adamw, static_args=("mask", "mu_dtype"), hyperparam_dtype=jnp.float32
    )(
        learning_rate=schedule,
        b1=config.b1,
        b2=config.b2,
        eps=config.eps,
        weight_decay=config.weight_decay,
        mu_dtype=jnp.float32,
        mask=_is_matrix,
    )
    if config.clip_norm is None:
        return adamw
    return optax.chain(optax.clip_by_global_norm(config.clip_norm), adamw)


def current_lr(opt_state) -> jax.Array | None:
    """Learning rate of the last update, read from an injected-hyperparams state."""
    hyperparams = getattr(opt_state, "hyperparams", None)
    if isinstance(hyperparams, dict) and "learning_rate" in hyperparams:
        return hyperparams["learning_rate"]
    if isinstance(opt_state, tuple):  # a chain's states
        for inner in opt_state:
            lr = current_lr(inner)
            if lr is not None:
                return lr
    return None


def split_trainable(params):
    """(what is trained, the frozen rest or None): (adapters, base) under LoRA."""
    if lora.has_adapters(params):
        return lora.partition(params)
    return params, None


def trainable(params):
    """What the optimizer updates: the adapters of an adapted model, else all of ``params``."""
    return split_trainable(params)[0]


def reference(state: TrainState):
    """The KL reference's params: ``ref_params``, or the base without adapters under LoRA."""
    if state.ref_params is None and lora.has_adapters(state.params):
        return lora.base_only(state.params)
    return state.ref_params


def checkpoint_view(state: TrainState) -> TrainState:
    """What a checkpoint holds: ``state`` with the params cut to `trainable` (adapters)."""
    return state.replace(params=trainable(state.params))


def from_checkpoint(state: TrainState, restored: TrainState) -> TrainState:
    """``restored`` (a `checkpoint_view`) with ``state``'s frozen base put back under it."""
    if not lora.has_adapters(state.params):
        return restored
    return restored.replace(params=lora.combine(restored.params, lora.partition(state.params)[1]))


def init_train_state(params, optimizer, *, kl_coef: float, extra=None) -> TrainState:
    """A fresh state at step 0.

    Args:
      params: policy params pytree (with LoRA adapters: only they are trained).
      optimizer: the optax transformation the train step will use.
      kl_coef: the KL weight; the reference params are a copy of ``params``
        when it is non-zero (and the params hold no adapters) and None otherwise.
      extra: pytree the loop carries along (passed through the train step).

    Returns:
      A `TrainState`. The reference is a real copy: the train step donates the
      state, and a buffer shared by two leaves cannot be donated.
    """
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}.")
    copy = kl_coef != 0 and not lora.has_adapters(params)
    ref = jax.tree_util.tree_map(jnp.copy, params) if copy else None
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=optimizer.init(trainable(params)),
        ref_params=ref,
        extra=extra,
    )


def make_mesh_from_config(config) -> Mesh:
    """A (data, fsdp, tensor) mesh from config fields ``data, fsdp, tensor``.

    One axis may be -1: it takes the devices the others leave. The mesh uses the
    first ``data x fsdp x tensor`` devices.
    """
    sizes = [int(config[a]) for a in ("data", "fsdp", "tensor")]
    if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"mesh sizes must be >= 1 (one may be -1), got {sizes}.")
    if -1 in sizes:
        known = int(np.prod([s for s in sizes if s != -1]))
        sizes[sizes.index(-1)] = max(jax.device_count() // known, 1)
    count = int(np.prod(sizes))
    if count > jax.device_count():
        raise ValueError(f"mesh {sizes} needs {count} devices, have {jax.device_count()}.")
    return sharding.make_mesh(*sizes, devices=jax.devices()[:count])


def _names(path) -> list:
    names = []
    for k in path:
        if isinstance(k, jax.tree_util.DictKey):
            names.append(k.key)
        elif isinstance(k, jax.tree_util.SequenceKey):
            names.append(k.idx)
        elif isinstance(k, jax.tree_util.GetAttrKey):
            names.append(k.name)
        else:
            names.append(str(k))
    # nnx.State leaves sit under a Variable's `.value`; the rules key on the param name.
    return names[:-1] if names and names[-1] == "value" else names


def tree_shardings(tree, mesh: Mesh):
    """NamedShardings for params-like pytrees (params, grads, Adam moments).

    The partition rule of a leaf is looked up by the last names on its path
    (``q_proj/kernel``, ``embed_tokens``), so the params and every optimizer
    moment that mirrors them get the same layout; scalars (counts, injected
    hyperparameters) and unknown leaves are replicated.
    """

    def one(path, leaf):
        shape = getattr(leaf, "shape", ())
        return NamedSharding(mesh, sharding.param_spec(_names(path), shape, mesh))

    return jax.tree_util.tree_map_with_path(one, tree)


def state_shardings(state: TrainState, mesh: Mesh) -> TrainState:
    """A `TrainState` of NamedShardings: params/opt/ref by the rules, rest replicated."""
    replicated = NamedSharding(mesh, PartitionSpec())
    return TrainState(
        step=replicated,
        params=tree_shardings(state.params, mesh),
        opt_state=tree_shardings(state.opt_state, mesh),
        ref_params=None if state.ref_params is None else tree_shardings(state.ref_params, mesh),
        extra=jax.tree_util.tree_map(lambda _: replicated, state.extra),
    )


def shard_state(state: TrainState, mesh: Mesh) -> TrainState:
    """Places every leaf of ``state`` on ``mesh`` by `state_shardings` (copies once)."""
    return jax.device_put(state, state_shardings(state, mesh))
