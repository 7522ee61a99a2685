"""Overlap: the next step's batch, sampled while this step's programs execute.

With `config.overlap` (off by default) the trainer (`wmrl_jax.train.loop`)
samples step t + 1's batch during step t, once step t's executions are
submitted and before they are collected: generation runs on the accelerator
while the outcome source's pool runs the programs, so a step whose executions
dominate its wall clock costs about its executions, not its executions plus its
generation. It saves wall clock, not compute: the ledger charges the same
generation.

The batch is one update stale. Sampled from the params step t starts from, it
is trained on by update t + 1, after update t; the train step's importance ratio
exp(log π_θ − log π_old) against the log-probs recorded at sampling
(`Rollout.batch["old_logprobs"]`), and its clipping, correct for that, so the
first epoch of such a step is no longer on-policy (ratio ≠ 1). Never more than
one step stale: only step t + 1's batch is sampled ahead, and only during step t.

What does not change:

* the batch's randomness: it is the batch step t + 1 would sample (the same
  tasks, the same rollout key), from older params. If step t + 1's tasks turn
  out otherwise (a choice that depends on step t's outcome), the batch is
  dropped, its generation charged, and step t + 1 samples afresh;
* the ledger: a batch's tokens and seconds are charged once, to the step that
  trains on it. A batch that no step trains on (the compute budget ran out at
  step t) is not charged;
* resume: the batch sampled ahead travels with the checkpoint (`encode`,
  `decode`: its exact bytes in the JSON metadata, a few MB for an LLM's batch),
  so a resumed run trains on what the uninterrupted run did. (A run extended
  past its `num_steps` starts the extension with a fresh batch: its last step
  sampled nothing ahead. From there on it differs from a run configured
  longer from the start.)

Sampling ahead happens in the trainer's own thread, between submitting and
collecting: the concurrency is the outcome source's (its pool, the sandboxes).
A second thread would race the main thread's cross-process collectives
(`wmrl_jax.train.multihost`), and the train step donates the params it would
read. A step samples ahead only when it has programs executing (with nothing
to wait for, sampling early hides nothing and only makes the batch stale), and
never at the config's last step. The agent's `rollout` must depend on its
arguments alone (params, tasks, key), as the `Agent` protocol has it, not on
outcomes observed during step t.

Example:
    >>> ahead = Ahead(step + 1, task_ids(tasks), rollout, gen_seconds=0.8)
    >>> meta["ahead"] = encode(ahead)                 # with the checkpoint
    >>> decode(meta["ahead"]).rollout.batch["tokens"]  # the same bytes
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from wmrl_jax.agents.base import Agent, Rollout
from wmrl_jax.envs.task import Task
from wmrl_jax.train import stages
from wmrl_jax.train.ledger import LedgerStep, Timer

__all__ = ["Ahead", "claim", "decode", "encode", "executing", "sample_ahead", "task_ids"]

log = logging.getLogger(__name__)


class Ahead(NamedTuple):
    """A batch sampled one step ahead.

    Attributes:
      step: the step that trains on it.
      task_ids: the ids of that step's tasks, in order (checked before use).
      rollout: the batch, sampled from the params before the previous update.
      gen_seconds: the wall seconds its generation took (charged when used).
    """

    step: int
    task_ids: tuple[str, ...]
    rollout: Rollout
    gen_seconds: float


def task_ids(tasks: Sequence[Task]) -> tuple[str, ...]:
    """The ids of a step's tasks, in order."""
    return tuple(t.id for t in tasks)


def executing(pending: Mapping[int, tuple]) -> bool:
    """Whether a step has executions in flight: a `Runner.submit` result with at least
    one future (rows the cache answers have None)."""
    return any(future is not None for _, future in pending.values())


def sample_ahead(agent: Agent, params, tasks: Sequence[Task], *, step: int, group_size: int,
                 key) -> Ahead:  # fmt: skip
    """Samples `step`'s batch now, during the step before: from the params before
    that step's update, while its programs execute.

    Raises:
      RuntimeError: the sampling failed; the message names both steps, the cause is chained.
    """
    try:
        with Timer() as timer:
            rollout = agent.rollout(params, tasks, group_size=group_size, key=key)
    except Exception as e:
        raise RuntimeError(
            f"config.overlap: sampling step {step}'s batch ahead, while step {step - 1}'s "
            f"programs execute, failed: {type(e).__name__}: {e}"
        ) from e
    return Ahead(step, task_ids(tasks), rollout, timer.seconds)


def claim(
    ahead: Ahead | None, step: int, tasks: Sequence[Task], timing: LedgerStep
) -> Rollout | None:
    """The batch sampled ahead for `step` and its `tasks`, charged to `timing`; else None.

    A batch sampled for other tasks is dropped, but its generation was spent: it
    is charged all the same (its seconds and tokens), and the step samples afresh.
    """
    if ahead is None:
        return None
    if (ahead.step, ahead.task_ids) == (step, task_ids(tasks)):
        # Charged to the step that trains on it.
        stages.charge_rollout(timing, ahead.rollout, ahead.gen_seconds)
        return ahead.rollout
    log.warning("step %d: the batch sampled ahead was for other tasks; resampling", step)
    stages.charge_rollout(timing, ahead.rollout, ahead.gen_seconds)
    timing.add(gen_tokens=ahead.rollout.gen_tokens)
    return None


def _encode_array(a) -> dict[str, Any]:
    a = np.ascontiguousarray(a)
    return {"dtype": a.dtype.str, "shape": list(a.shape), "data": base64.b64encode(a).decode()}


def _decode_array(d: Mapping[str, Any]) -> np.ndarray:
    flat = np.frombuffer(base64.b64decode(d["data"]), dtype=np.dtype(d["dtype"]))
    return flat.reshape(d["shape"]).copy()  # writable, like the sampler's arrays


def encode(ahead: Ahead) -> dict[str, Any]:
    """`ahead` as strict JSON: arrays as (dtype, shape, base64 bytes), so `decode`
    gives back the same bytes."""
    r = ahead.rollout
    return {
        "step": int(ahead.step),
        "task_ids": list(ahead.task_ids),
        "gen_seconds": float(ahead.gen_seconds),
        "programs": list(r.programs),
        "batch": {k: _encode_array(v) for k, v in r.batch.items()},
        "gen_tokens": int(r.gen_tokens),
        "causes": list(r.causes),
        "features": None if r.features is None else _encode_array(r.features),
    }


def decode(payload: Mapping[str, Any]) -> Ahead:
    """Inverse of `encode`.

    Raises:
      ValueError: `payload` is not an `encode` result (a damaged checkpoint).
    """
    try:
        rollout = Rollout(
            programs=[str(p) for p in payload["programs"]],
            batch={k: _decode_array(v) for k, v in payload["batch"].items()},
            gen_tokens=int(payload["gen_tokens"]),
            causes=tuple(payload["causes"]),
            features=None if payload["features"] is None else _decode_array(payload["features"]),
        )
        return Ahead(
            int(payload["step"]),
            tuple(payload["task_ids"]),
            rollout,
            float(payload["gen_seconds"]),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(
            f"the checkpoint's batch sampled ahead (config.overlap) does not read: "
            f"{type(e).__name__}: {e}"
        ) from e
