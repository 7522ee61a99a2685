"""The sharded GRPO train step: ``train_step(state, batch, key) -> (state, metrics)``.

One call takes a batch of sampled sequences and runs ``num_epochs`` policy
updates on it. Each epoch is ONE optimizer update over the whole batch: the
batch is cut into ``num_microbatches`` micro-batches, gradients are accumulated
in float32 with a ``lax.scan``, and every micro-batch's `core.grpo.grpo_loss`
is rescaled so that the sum is exactly the loss of the whole batch (the global
token mean, not a mean of micro-batch means). The importance ratio is taken
against the sampling log-probs in the batch, so epoch 1 is on-policy
(ratio 1) and later epochs are clipped off-policy updates. Reference log-probs
(for the KL term) are computed once per call, before the epochs, and not at all
when the KL weight is 0. With ``remat=True`` in the config every layer is
rematerialised in the backward pass and the LM head runs in token blocks
(`sequence_logprobs`): the same loss and gradients in a fraction of the memory,
for about a third more compute.

Batch (dict of arrays, B sequences of T tokens; other keys are ignored):
  tokens int32 [B, T]; attention_mask int32 [B, T] (1 = real token, left
  padding allowed); loss_mask float32 [B, T] (1 on sampled completion tokens;
  the log-prob of position t comes from the logits at t - 1, so column 0 is
  never a loss token); old_logprobs float32 [B, T]; advantages float32 [B].

Placement: the batch's dim 0 is split over ("data", "fsdp"), params and the
optimizer moments by `wmrl_jax.models.sharding`'s rules, everything else
replicated. The step is jitted once with explicit in/out shardings and the
state donated; a caller places the state once with ``step.shard_state(state)``
(or `wmrl_jax.train.state.shard_state`) and feeds each returned state back:

    step = make_train_step(graphdef, make_optimizer(cfg.optimizer), cfg, mesh)
    state = step.shard_state(init_train_state(params, optimizer, kl_coef=0.0))
    state, metrics = step(state, batch, key)       # batch: numpy or jax arrays

The first call traces and compiles; ``step.compile_ahead(state, shapes)`` does
that in a background thread instead, so a loop can overlap it with sampling.
"""

from __future__ import annotations

import concurrent.futures
import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from wmrl_jax.core import grpo
from wmrl_jax.models import lm_head, qwen3
from wmrl_jax.models.sharding import BATCH
from wmrl_jax.train import state as state_lib
from wmrl_jax.train.state import (
    TrainState,
    init_train_state,
    make_mesh_from_config,
    make_optimizer,
    shard_state,
)

# The state's constructors are re-exported, so a loop needs one import.
__all__ = [
    "TrainState",
    "TrainStep",
    "check_batch",
    "default_step_config",
    "init_train_state",
    "loss_and_grads",
    "make_mesh_from_config",
    "make_optimizer",
    "make_train_step",
    "sequence_logprobs",
    "shard_state",
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


def default_step_config() -> ml_collections.ConfigDict:
    """The fields `make_train_step` reads (loss, micro-batches, epochs, dtype, remat)."""
    return ml_collections.ConfigDict(
        dict(
            loss=dict(
                clip_low=0.2,
                clip_high=0.2,
                kl_coef=0.0,
                kl_estimator="k3",
                aggregation="token_mean",
                norm_constant=1.0,  # only read by aggregation "seq_sum_norm"
            ),
            num_microbatches=1,
            num_epochs=1,
            compute_dtype="float32",
            remat=False,
        )
    )


def check_step_config(config) -> None:
    """Raises ValueError on a config `make_train_step` cannot run."""
    c = config.loss
    problems = []
    if c.aggregation not in grpo.AGGREGATION_MODES:
        problems.append(f"loss.aggregation must be one of {grpo.AGGREGATION_MODES}")
    if c.kl_estimator not in grpo.KL_ESTIMATORS:
        problems.append(f"loss.kl_estimator must be one of {grpo.KL_ESTIMATORS}")
    if not 0.0 <= c.clip_low < 1.0 or (c.clip_high is not None and c.clip_high < 0):
        problems.append(f"need 0 <= clip_low < 1, clip_high >= 0; got {c.clip_low}, {c.clip_high}")
    if c.kl_coef < 0:
        problems.append(f"loss.kl_coef must be >= 0, got {c.kl_coef}")
    if (c.get("aux_coef") or 0) < 0:
        problems.append(f"loss.aux_coef must be >= 0, got {c.aux_coef}")
    if c.aggregation == "seq_sum_norm" and not (c.get("norm_constant") or 0) > 0:
        problems.append("aggregation 'seq_sum_norm' needs loss.norm_constant > 0")
    for name in ("num_microbatches", "num_epochs"):
        value = config[name]
        if not isinstance(value, int) or value < 1:
            problems.append(f"{name} must be an int >= 1, got {value!r}")
    if not isinstance(config.get("remat", False), bool):
        problems.append(f"remat must be true or false, got {config.remat!r}")
    if config.get("compute_dtype") not in (None, *COMPUTE_DTYPES):
        problems.append(f"compute_dtype must be one of {sorted(COMPUTE_DTYPES)} or None")
    if problems:
        raise ValueError("bad train step config: " + "; ".join(problems) + ".")


def sequence_logprobs(
    graphdef, params, tokens, attention_mask, *, compute_dtype=None, remat: bool = False
):
    """Per-token log-probs and entropies of a batch under ``params``, in float32.

    Position t holds ``log p(tokens[:, t] | tokens[:, :t])`` from the logits at
    t - 1; column 0 has no prediction and holds 0.

    With ``remat`` the values and gradients are the same, at a fraction of the
    memory: each layer is rematerialised in the backward pass
    (`qwen3.layer_call`) and the LM head runs in token blocks
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


def _micro_loss(params, mb, *, graphdef, config, dtype, total_weight, total_aux):
    """One micro-batch's share of the whole-batch loss, and its metrics."""
    c, aux_coef = config.loss, _aux_coef(config)
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


def loss_and_grads(graphdef, params, batch, *, config, ref_logprobs=None, mesh=None):
    """Exact whole-batch GRPO loss, float32 gradient and metrics, by micro-batches.

    Args:
      graphdef: `nnx.GraphDef` of a Qwen3.
      params: policy params.
      batch: the train batch (see the module docstring), B divisible by
        ``config.num_microbatches``.
      config: step config (`default_step_config`).
      ref_logprobs: reference log-probs float32 [B, T]; required when
        ``config.loss.kl_coef`` is non-zero.
      mesh: optional mesh; micro-batches then stay split over ("data", "fsdp").

    Returns:
      ``(loss, grads, metrics)``: float32 scalar, float32 grads with the
      structure of ``params``, and a dict of float32 scalars (see `TrainStep`).
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


def make_train_step(graphdef, optimizer, config, mesh: Mesh, state_shardings=None):
    """Builds the jitted, sharded train step; see `TrainStep`."""
    return TrainStep(graphdef, optimizer, config, mesh, state_shardings=state_shardings)


class TrainStep:
    """``train_step(state, batch, key) -> (state, metrics)``, jitted once, state donated.

    Metrics are float32 scalars: ``loss``, ``pg_loss``, ``kl``, ``clip_frac``,
    ``ratio_mean``, ``ratio_min``, ``ratio_max``, ``adv_mean``, ``entropy`` (mean
    over loss tokens), ``grad_norm`` (before clipping), ``lr`` (of the update)
    of the first epoch -- the on-policy one -- and ``tokens`` (loss tokens in the
    batch); with ``num_epochs > 1`` also ``epoch<e>/<name>`` for epochs e >= 2.

    Attributes:
      mesh: the (data, fsdp, tensor) mesh.
      batch_shardings: NamedShardings of the batch dict.
      trace_count: how many times the step was traced (1 after any number of
        calls with the same structures: a second call does not recompile).
    """

    def __init__(self, graphdef, optimizer, config, mesh: Mesh, *, state_shardings=None):
        check_step_config(config)
        self.graphdef, self.optimizer, self.config, self.mesh = graphdef, optimizer, config, mesh
        self.batch_shards = mesh.shape["data"] * mesh.shape["fsdp"]
        rows = NamedSharding(mesh, PartitionSpec(BATCH))
        self.spec = batch_spec(config)
        self.batch_shardings = {k: rows for k in self.spec}
        self._replicated = NamedSharding(mesh, PartitionSpec())
        self._state_shardings = state_shardings
        self._jitted = None
        self._grads_fn = None
        self._ahead = None
        self.trace_count = 0

    def state_shardings(self, state: state_lib.TrainState):
        """The state's shardings (given at construction, or by the rules)."""
        if self._state_shardings is None:
            self._state_shardings = state_lib.state_shardings(state, self.mesh)
        return self._state_shardings

    def shard_state(self, state: state_lib.TrainState) -> state_lib.TrainState:
        """Places ``state`` on the mesh (once, before the first call)."""
        return jax.device_put(state, self.state_shardings(state))

    def shard_batch(self, batch) -> dict:
        """Checks the batch, casts it to the layout's dtypes and places it."""
        check_batch(
            batch,
            num_microbatches=self.config.num_microbatches,
            batch_shards=self.batch_shards,
            spec=self.spec,
        )
        out = {}
        for key, (_, dtype) in self.spec.items():
            x = batch[key]
            x = x.astype(dtype) if isinstance(x, jax.Array) else np.asarray(x, dtype)
            out[key] = jax.device_put(x, self.batch_shardings[key])
        return out

    def _check_state(self, state) -> None:
        if self.config.loss.kl_coef != 0 and state.ref_params is None:
            raise ValueError("loss.kl_coef != 0 but the state has no ref_params.")

    def _ref_logprobs(self, ref_params, batch):
        dtype = COMPUTE_DTYPES.get(self.config.get("compute_dtype"))
        m = self.config.num_microbatches
        micro = split_microbatches(
            {k: batch[k] for k in ("tokens", "attention_mask")}, m, self.mesh
        )

        def one(_, mb):
            logp, _ = sequence_logprobs(
                self.graphdef,
                ref_params,
                mb["tokens"],
                mb["attention_mask"],
                compute_dtype=dtype,
                remat=bool(self.config.get("remat", False)),  # here: the blocked LM head
            )
            return None, jax.lax.stop_gradient(logp)

        _, logp = jax.lax.scan(one, None, micro)  # [M, B / M, T], rows strided
        return logp.swapaxes(0, 1).reshape(batch["tokens"].shape)

    def _step(self, state, batch, key):
        del key  # the loss is deterministic; the key is kept for stochastic extensions
        self.trace_count += 1
        kl_on = self.config.loss.kl_coef != 0
        ref_logp = self._ref_logprobs(state.ref_params, batch) if kl_on else None
        param_shardings = state_lib.tree_shardings(state.params, self.mesh)

        def epoch(carry, _):
            params, opt_state = carry
            _, grads, metrics = loss_and_grads(
                self.graphdef,
                params,
                batch,
                config=self.config,
                ref_logprobs=ref_logp,
                mesh=self.mesh,
            )
            metrics["grad_norm"] = optax.tree.norm(grads)
            grads = jax.tree_util.tree_map(lambda g, p: g.astype(p.dtype), grads, params)
            updates, opt_state = self.optimizer.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            params = jax.lax.with_sharding_constraint(params, param_shardings)
            lr = state_lib.current_lr(opt_state)
            metrics["lr"] = jnp.float32(jnp.nan) if lr is None else jnp.asarray(lr, jnp.float32)
            return (params, opt_state), metrics

        epochs = self.config.num_epochs
        (params, opt_state), per_epoch = jax.lax.scan(
            epoch, (state.params, state.opt_state), None, length=epochs
        )
        metrics = {k: v[0] for k, v in per_epoch.items()}
        for e in range(1, epochs):
            metrics |= {f"epoch{e + 1}/{k}": v[e] for k, v in per_epoch.items() if k != "tokens"}
        new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
        return new_state, metrics

    def _jit(self, state):
        if self._jitted is None:
            shardings = self.state_shardings(state)
            self._jitted = jax.jit(
                self._step,
                in_shardings=(shardings, self.batch_shardings, self._replicated),
                out_shardings=(shardings, self._replicated),
                donate_argnums=0,
            )
        return self._jitted

    def __call__(self, state: state_lib.TrainState, batch, key):
        """One GRPO step on ``batch``; ``state`` must be placed (`shard_state`) and is donated."""
        self._check_state(state)
        batch = self.shard_batch(batch)
        self._wait_ahead()
        return self._jit(state)(state, batch, key)

    def compile_ahead(self, state: state_lib.TrainState, batch, key=None):
        """Traces and compiles the step for ``batch``'s shapes in a background thread.

        A loop knows its batch shapes before it has the batch (B sequences of
        prompt + completion tokens), so it can start the compile before sampling:
        XLA then compiles the update while the rollouts, rewards and sandbox
        executions run, instead of after them. The next call (or `lower`) waits
        for this compile and reuses it: same jit, same executable, no retrace.
        Nothing is donated; ``state`` must stay alive until that call. It pays
        when the host has idle cores or the loop waits (sandbox executions); on
        a CPU the sampler already saturates, the two compiles compete and the
        first step gets slower (``benchmarks.grpo_step --compile-ahead``).

        Args:
          state: the placed state the next call will get (only its shapes and
            shardings are read).
          batch: dict with the train-batch keys; values are arrays or anything
            with a ``shape`` (``jax.ShapeDtypeStruct``); checked here, at once.
          key: a PRNG key of the kind the calls will pass (default: a new-style
            ``jax.random.key``); another kind of key compiles again.

        Returns:
          A ``concurrent.futures.Future`` of the compiled step (errors surface
          from it, and from the next call).

        Example:
          >>> step.compile_ahead(state, {k: jax.ShapeDtypeStruct((b, t), d) for ...})
          >>> out = models.sample(...)                  # compiles and runs meanwhile
          >>> state, metrics = step(state, batch, key)  # waits for the compile, no retrace
        """
        self._check_state(state)
        zeros = {
            k: np.zeros(np.shape(batch[k]), d) for k, (_, d) in self.spec.items() if k in batch
        }
        placed = self.shard_batch(zeros)
        jitted = self._jit(state)
        key = jax.random.key(0) if key is None else key
        self._wait_ahead()
        executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="compile_ahead")
        self._ahead = executor.submit(lambda: jitted.lower(state, placed, key).compile())
        executor.shutdown(wait=False)
        return self._ahead

    def _wait_ahead(self) -> None:
        """Waits for a `compile_ahead` in flight (a second compile would duplicate it)."""
        if self._ahead is not None:
            ahead, self._ahead = self._ahead, None
            ahead.result()

    def lower(self, state: state_lib.TrainState, batch, key):
        """The step traced and lowered for these arguments (no XLA compile, nothing donated)."""
        self._check_state(state)
        batch = self.shard_batch(batch)
        self._wait_ahead()
        return self._jit(state).lower(state, batch, key)

    def loss_and_grads(self, state: state_lib.TrainState, batch):
        """First-epoch ``(loss, grads, metrics)`` at ``state`` (not donated, no update)."""
        self._check_state(state)
        batch = self.shard_batch(batch)
        if self._grads_fn is None:
            shardings = self.state_shardings(state)

            def fn(state, batch):
                kl_on = self.config.loss.kl_coef != 0
                ref = self._ref_logprobs(state.ref_params, batch) if kl_on else None
                return loss_and_grads(
                    self.graphdef,
                    state.params,
                    batch,
                    config=self.config,
                    ref_logprobs=ref,
                    mesh=self.mesh,
                )

            grads_out = state_lib.tree_shardings(state.params, self.mesh)
            self._grads_fn = jax.jit(
                fn,
                in_shardings=(shardings, self.batch_shardings),
                out_shardings=(self._replicated, grads_out, self._replicated),
            )
        return self._grads_fn(state, batch)
