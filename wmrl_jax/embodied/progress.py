"""The world model: a progress model that predicts an episode's outcome from its prefix.

The outcome of an episode is its mean per-step reward ``y = return / H``. A
progress model reads the first k of the H steps — the observation after k
steps and the return of those k steps — and predicts ``y``:

    ŷ = f_θ(o_k / scale, R_{0:k} / H),

a small MLP trained by mean squared error. It is the embodied analogue of the
LLM world model: cheap (k steps instead of H, then one network call), biased
where its training data did not go, and noisy because the rest of the episode
is random. It learns from executed (anchor) episodes, kept in a fixed-size
`ProgressBuffer`, and is warm-started on episodes of another policy.

A user's own progress model is any callable with the same signature as
`ProgressModel.predict` (see `wmrl_jax.embodied.libero` for frames/states).

Example:
  >>> model = make_progress_model(feature_dim=11, hidden=(16,), learning_rate=1e-2)
  >>> state = model.init(jax.random.key(0))
  >>> buf = ProgressBuffer.create(capacity=8, feature_dim=11)
  >>> buf = buf.add(np.ones((3, 11), np.float32), np.array([0.1, 0.2, 0.3]))
  >>> state = model.fit(state, buf, num_steps=5)
  >>> model.predict(state, np.ones((2, 11), np.float32)).shape
  (2,)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import optax

from wmrl_jax.embodied import policy as policy_lib
from wmrl_jax.embodied.rollout import Episodes


def progress_features(
    prefix_obs: np.ndarray, prefix_return: np.ndarray, horizon: int
) -> np.ndarray:
    """Features of a truncated rollout.

    Args:
      prefix_obs: scaled observation after k steps, of shape [N, D].
      prefix_return: return of the first k steps, of shape [N].
      horizon: H, the full episode length (the return's scale).

    Returns:
      Float32 features of shape [N, D + 1].
    """
    prefix_obs = np.asarray(prefix_obs, np.float32)
    prefix_return = np.asarray(prefix_return, np.float32)
    if prefix_obs.ndim != 2 or prefix_return.shape != prefix_obs.shape[:1]:
        raise ValueError(
            f"prefix_obs must be [N, D] and prefix_return [N], got {prefix_obs.shape} "
            f"and {prefix_return.shape}"
        )
    return np.concatenate([prefix_obs, prefix_return[:, None] / horizon], axis=1)


class ProgressBuffer(NamedTuple):
    """A ring buffer of (features, outcome) pairs, fixed shapes (host side).

    Attributes:
      features: of shape [M, F].
      targets: of shape [M].
      valid: bool, of shape [M].
      next_slot: the write position.
    """

    features: np.ndarray
    targets: np.ndarray
    valid: np.ndarray
    next_slot: int

    @classmethod
    def create(cls, *, capacity: int, feature_dim: int) -> ProgressBuffer:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        return cls(
            np.zeros((capacity, feature_dim), np.float32),
            np.zeros(capacity, np.float32),
            np.zeros(capacity, bool),
            0,
        )

    def add(self, features: np.ndarray, targets: np.ndarray) -> ProgressBuffer:
        """Appends pairs (the oldest drop out); non-finite targets are skipped."""
        features = np.asarray(features, np.float32)
        targets = np.asarray(targets, np.float32)
        if features.ndim != 2 or features.shape[1] != self.features.shape[1]:
            raise ValueError(
                f"features must be [N, {self.features.shape[1]}], got {features.shape}"
            )
        keep = np.isfinite(targets) & np.isfinite(features).all(axis=1)
        features, targets = (
            features[keep][-len(self.targets) :],
            targets[keep][-len(self.targets) :],
        )
        slots = (self.next_slot + np.arange(len(targets))) % len(self.targets)
        new = ProgressBuffer(
            self.features.copy(), self.targets.copy(), self.valid.copy(), self.next_slot
        )
        new.features[slots], new.targets[slots], new.valid[slots] = features, targets, True
        return new._replace(next_slot=int((self.next_slot + len(targets)) % len(self.targets)))


class ProgressState(NamedTuple):
    """The progress model's parameters, optimiser state and PRNG key."""

    params: tuple
    opt_state: optax.OptState
    key: jax.Array


class ProgressModel(NamedTuple):
    """Functions built by `make_progress_model`.

    Attributes:
      init: ``key -> ProgressState``.
      predict: ``(state, features [N, F]) -> predictions [N]`` (numpy float32).
      fit: ``(state, buffer, *, num_steps) -> state``: minibatch Adam on the buffer.
    """

    init: Callable[[jax.Array], ProgressState]
    predict: Callable[[ProgressState, np.ndarray], np.ndarray]
    fit: Callable[..., ProgressState]


@functools.cache
def make_progress_model(
    *,
    feature_dim: int,
    hidden: tuple[int, ...] = (64, 64),
    learning_rate: float = 3e-3,
    batch_size: int = 256,
) -> ProgressModel:
    """Builds a progress model (MLP regressor of the outcome on prefix features).

    Cached per arguments: runs with the same settings share compilations.
    """
    optimizer = optax.adam(learning_rate)

    def init(key):
        init_key, key = jax.random.split(key)
        params = policy_lib.init_mlp(init_key, (feature_dim, *hidden, 1), final_scale=0.1)
        return ProgressState(params, optimizer.init(params), key)

    @jax.jit
    def _predict(params, features):
        return policy_lib.mlp(params, features)[..., 0]

    def predict(state, features):
        features = np.asarray(features, np.float32)
        if features.ndim != 2 or features.shape[1] != feature_dim:
            raise ValueError(f"features must be [N, {feature_dim}], got {features.shape}")
        return np.asarray(_predict(state.params, features))

    def _loss(params, features, targets, weights):
        err = policy_lib.mlp(params, features)[..., 0] - targets
        return jnp.sum(weights * err**2) / jnp.maximum(jnp.sum(weights), 1.0)

    @functools.partial(jax.jit, static_argnames="num_steps")
    def _fit(state, features, targets, valid, num_steps):
        probs = valid / jnp.maximum(jnp.sum(valid), 1.0)

        def body(carry, key):
            params, opt_state = carry
            idx = jax.random.choice(key, targets.shape[0], (batch_size,), p=probs)
            grads = jax.grad(_loss)(params, features[idx], targets[idx], valid[idx])
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), None

        key, sub = jax.random.split(state.key)
        (params, opt_state), _ = jax.lax.scan(
            body, (state.params, state.opt_state), jax.random.split(sub, num_steps)
        )
        return ProgressState(params, opt_state, key)

    def fit(state, buffer, *, num_steps):
        if not buffer.valid.any() or num_steps <= 0:
            return state
        valid = buffer.valid.astype(np.float32)
        return _fit(state, buffer.features, buffer.targets, valid, num_steps)

    return ProgressModel(init, predict, fit)


class WorldModel(Protocol):
    """What the training loop asks of a world model (host side, may hold state).

    ``predict`` scores the batch's episodes from their prefixes; ``observe``
    receives the executed episodes' real outcomes (a fixed, pre-trained model
    may ignore them). `LearnedProgress` is the built-in one;
    `wmrl_jax.embodied.libero.CallableProgress` wraps a user's callable.
    """

    def predict(self, episodes: Episodes) -> tuple[np.ndarray, np.ndarray]:
        """Returns ``(mean [N], var [N])`` predicted outcomes (inf var: unusable)."""

    def observe(self, episodes: Episodes, executed: np.ndarray, outcome: np.ndarray) -> None:
        """Learns from ``outcome`` [N] where ``executed`` [N] (bool) holds."""


class LearnedProgress:
    """The built-in `WorldModel`: `make_progress_model` trained online on a `ProgressBuffer`.

    Its predictive variance is reported as 1 for every sample: the reward
    correction then uses one global σ²_wm estimated from anchor residuals.
    """

    def __init__(
        self,
        model: ProgressModel,
        state: ProgressState,
        buffer: ProgressBuffer,
        *,
        horizon: int,
        fit_steps: int,
        online: bool,
    ):
        self.model, self.state, self.buffer = model, state, buffer
        self.horizon, self.fit_steps, self.online = horizon, fit_steps, online

    def features(self, episodes: Episodes) -> np.ndarray:
        return progress_features(episodes.prefix_obs, episodes.prefix_return, self.horizon)

    def predict(self, episodes: Episodes) -> tuple[np.ndarray, np.ndarray]:
        mean = self.model.predict(self.state, self.features(episodes))
        return mean, np.ones_like(mean)

    def observe(self, episodes: Episodes, executed: np.ndarray, outcome: np.ndarray) -> None:
        if self.online:
            self.pretrain(episodes, executed, outcome, num_steps=self.fit_steps)

    def pretrain(
        self, episodes: Episodes, executed: np.ndarray, outcome: np.ndarray, *, num_steps: int
    ) -> None:
        """Adds executed episodes to the buffer and fits, online or not (warm start)."""
        executed = np.asarray(executed, bool)
        if executed.any():
            self.buffer = self.buffer.add(self.features(episodes)[executed], outcome[executed])
            self.state = self.model.fit(self.state, self.buffer, num_steps=num_steps)
