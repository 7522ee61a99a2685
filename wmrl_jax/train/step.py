"""The sharded GRPO train step: ``train_step(state, batch, key) -> (state, metrics)``.

One call takes a batch of sampled sequences (the layout in
`wmrl_jax.train.loss`) and runs ``num_epochs`` policy updates on it. Each epoch
is ONE optimizer update over the whole batch, from the exact whole-batch loss
and float32 gradient accumulated over ``num_microbatches`` micro-batches
(`loss.loss_and_grads`). The importance ratio is taken against the sampling
log-probs in the batch, so epoch 1 is on-policy (ratio 1) and later epochs are
clipped off-policy updates. Reference log-probs (for the KL term) are computed
once per call, before the epochs, and not at all when the KL weight is 0.

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

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from wmrl_jax.core import grpo
from wmrl_jax.models import lora
from wmrl_jax.models.sharding import BATCH
from wmrl_jax.train import loss as loss_lib
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
    "default_step_config",
    "init_train_state",
    "make_mesh_from_config",
    "make_optimizer",
    "make_train_step",
    "shard_state",
]


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
    if config.get("compute_dtype") not in (None, *loss_lib.COMPUTE_DTYPES):
        problems.append(f"compute_dtype must be one of {sorted(loss_lib.COMPUTE_DTYPES)} or None")
    if problems:
        raise ValueError("bad train step config: " + "; ".join(problems) + ".")


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
        self.spec = loss_lib.batch_spec(config)
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
        loss_lib.check_batch(
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
        if self.config.loss.kl_coef != 0 and state_lib.reference(state) is None:
            raise ValueError("loss.kl_coef != 0 but the state has no ref_params.")

    def _ref_logprobs(self, ref_params, batch):
        dtype = loss_lib.COMPUTE_DTYPES.get(self.config.get("compute_dtype"))
        m = self.config.num_microbatches
        micro = loss_lib.split_microbatches(
            {k: batch[k] for k in ("tokens", "attention_mask")}, m, self.mesh
        )

        def one(_, mb):
            logp, _ = loss_lib.sequence_logprobs(
                self.graphdef,
                ref_params,
                mb["tokens"],
                mb["attention_mask"],
                compute_dtype=dtype,
                remat=bool(self.config.get("remat", False)),  # here: the blocked LM head
            )
            return None, jax.lax.stop_gradient(logp)

        with jax.sharding.use_abstract_mesh(self.mesh.abstract_mesh):
            _, logp = jax.lax.scan(one, None, micro)  # [M, B / M, T], rows strided
        return logp.swapaxes(0, 1).reshape(batch["tokens"].shape)

    def _step(self, state, batch, key):
        del key  # the loss is deterministic; the key is kept for stochastic extensions
        self.trace_count += 1
        kl_on = self.config.loss.kl_coef != 0
        ref_logp = self._ref_logprobs(state_lib.reference(state), batch) if kl_on else None
        # Under LoRA only the adapters are differentiated and updated; the frozen base
        # stays out of the loop's carry and comes back unchanged.
        trainable, frozen = state_lib.split_trainable(state.params)
        param_shardings = state_lib.tree_shardings(trainable, self.mesh)

        def epoch(carry, _):
            params, opt_state = carry
            _, grads, metrics = loss_lib.loss_and_grads(
                self.graphdef,
                params,
                batch,
                config=self.config,
                ref_logprobs=ref_logp,
                mesh=self.mesh,
                frozen=frozen,
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
            epoch, (trainable, state.opt_state), None, length=epochs
        )
        params = params if frozen is None else lora.combine(params, frozen)
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
        """The step traced and lowered for these arguments (no XLA compile, nothing donated).

        ``state``, ``batch`` and ``key`` may be `jax.ShapeDtypeStruct`s carrying their
        shardings (ahead-of-time compilation without arrays, e.g. for a compile-only
        device): an abstract batch is checked for its shapes and used as it is.
        """
        self._check_state(state)
        if all(isinstance(x, jax.ShapeDtypeStruct) for x in batch.values()):
            loss_lib.check_batch(
                batch,
                num_microbatches=self.config.num_microbatches,
                batch_shards=self.batch_shards,
                spec=self.spec,
            )
        else:
            batch = self.shard_batch(batch)
        self._wait_ahead()
        return self._jit(state).lower(state, batch, key)

    def loss_and_grads(self, state: state_lib.TrainState, batch):
        """First-epoch ``(loss, grads, metrics)`` at ``state`` (not donated, no update).

        The grads have the structure of `state.trainable(state.params)`: the adapters
        alone under LoRA.
        """
        self._check_state(state)
        batch = self.shard_batch(batch)
        if self._grads_fn is None:
            shardings = self.state_shardings(state)

            def fn(state, batch):
                kl_on = self.config.loss.kl_coef != 0
                ref = self._ref_logprobs(state_lib.reference(state), batch) if kl_on else None
                trainable, frozen = state_lib.split_trainable(state.params)
                return loss_lib.loss_and_grads(
                    self.graphdef,
                    trainable,
                    batch,
                    config=self.config,
                    ref_logprobs=ref,
                    mesh=self.mesh,
                    frozen=frozen,
                )

            grads_out = state_lib.tree_shardings(state_lib.trainable(state.params), self.mesh)
            self._grads_fn = jax.jit(
                fn,
                in_shardings=(shardings, self.batch_shardings),
                out_shardings=(self._replicated, grads_out, self._replicated),
            )
        return self._grads_fn(state, batch)
