"""The resume guard: a workdir's checkpoints are resumed only by the run that wrote them.

A run resumes from its latest checkpoint (`wmrl_jax.train.loop.Trainer`), and
the checkpoints must be its own: the same config, up to what a resumed run may
change (`RESUMABLE_KEYS`: how long it trains, how often it evaluates, which
checkpoints it keeps, how many programs run at once), and the same outcome
source (a replay table's content digest). `check_resumable` compares both with
the checkpoints' metadata before any state is read, and names every difference.

Example:
    >>> resume_mismatch({"seed": 0, "num_steps": 4}, {"seed": 1, "num_steps": 8})
    ['seed']
"""

from __future__ import annotations

import json

import jax
import ml_collections

from wmrl_jax.train import state as state_lib
from wmrl_jax.train.config import base_config

__all__ = ["RESUMABLE_KEYS", "ResumeError", "check_resumable", "restore", "resume_mismatch"]

# Config keys (dotted) a resumed run may change: how long it trains, how often it
# evaluates, which checkpoints it keeps, how many programs run at once and when
# failing executions stop it (neither changes an outcome). A change to any other key
# makes it another run.
RESUMABLE_KEYS = ("num_steps", "eval_every", "checkpoint", "executor.workers",
                  "executor.max_infra_steps")  # fmt: skip


class ResumeError(ValueError):
    """A workdir holds checkpoints of another run; the message names every difference."""


def resume_mismatch(
    saved: dict, current: dict, prefix: str = "", defaults: dict | None = None
) -> list[str]:
    """Dotted config keys whose values differ between two config dicts, outside
    `RESUMABLE_KEYS` (dotted from the top level), sorted.

    A key the saved config lacks (an option added since the checkpoints were
    written) is no difference where its current value is its value in
    `defaults` (the default config): the earlier run behaved that way.
    """
    out = []
    for k in sorted(set(saved) | set(current)):
        if f"{prefix}{k}" in RESUMABLE_KEYS:
            continue
        a, b = saved.get(k, "<absent>"), current.get(k, "<absent>")
        default = (defaults or {}).get(k, "<absent>")
        if a == "<absent>" and b != "<absent>" and b == default:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            inner = default if isinstance(default, dict) else None
            out += resume_mismatch(a, b, f"{prefix}{k}.", inner)
        elif a != b:
            out.append(f"{prefix}{k}")
    return out


def check_resumable(
    meta: dict, config: ml_collections.ConfigDict, *, fingerprint: str | None, directory: str
) -> None:
    """Raises `ResumeError` (a ValueError) when the checkpoints were made by another run: another
    config (outside `RESUMABLE_KEYS`) or another outcome source (a rebuilt table).

    Args:
      meta: the latest checkpoint's metadata (its "config" JSON and
        "outcomes_fingerprint").
      config: the config of the run that would resume.
      fingerprint: its outcome source's fingerprint (`OutcomeSource.fingerprint`).
      directory: the checkpoints' directory, for the message.
    """
    why = []
    if "config" in meta:
        saved, current = (json.loads(c) for c in (meta["config"], config.to_json_best_effort()))
        defaults = json.loads(base_config(config.agent.kind).to_json_best_effort())
        why += [f"config {k}" for k in resume_mismatch(saved, current, defaults=defaults)]
        if saved.get("num_steps") != current["num_steps"] and (
            current["optimizer"]["total_steps"] < 1
        ):
            why.append(
                "config num_steps, which sets the learning-rate schedule's length "
                "(optimizer.total_steps = -1); fix optimizer.total_steps to extend a run"
            )
    if meta.get("outcomes_fingerprint") != fingerprint:
        why.append(f"outcome source ({meta.get('outcomes_fingerprint')} != {fingerprint})")
    if why:
        raise ResumeError(
            f"{directory} holds checkpoints of another run "
            f"({'; '.join(why)}): resume with the same config and outcome source, "
            "or start in a fresh workdir"
        )


def restore(checkpointer, state, config: ml_collections.ConfigDict, *, fingerprint: str | None):
    """`(state, meta)` of the latest checkpoint, once `check_resumable` has passed; None
    without a checkpoint.

    Args:
      checkpointer: the run's `checkpoint.Checkpointer`.
      state: the freshly initialised train state (its shapes and shardings are the
        restored state's; under LoRA a checkpoint holds the adapters and the frozen
        base stays the loaded one).
      config: the config of the run that would resume.
      fingerprint: its outcome source's fingerprint.
    """
    if checkpointer.latest_step() is None:
        return None
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
        if isinstance(x, jax.Array) else x,
        state_lib.checkpoint_view(state),
    )  # fmt: skip
    check_resumable(  # Before reading any state.
        checkpointer.meta(), config, fingerprint=fingerprint, directory=checkpointer.directory
    )
    restored, meta = checkpointer.restore(abstract_state=abstract)
    return state_lib.from_checkpoint(state, restored), meta
