"""Checkpoints with orbax: train state + host metadata, keep-N and best retention, HF export.

Each step directory holds two items written by one `orbax.checkpoint.CheckpointManager`:

* `state`: the train-state pytree of JAX arrays (`StandardSave` / `StandardRestore`;
  sharded arrays are written per shard and restored into the shardings of the
  abstract target). None leaves (e.g. `ref_params` when the KL weight is 0),
  NamedTuples (the correction state) and typed PRNG keys round-trip.
* `meta`: a JSON object of host data (`JsonSave` / `JsonRestore`): the task-iterator
  position, `Ledger.to_dict()`, the config, the step's metrics. JSON turns tuples
  into lists; floats round-trip exactly.

Retention is orbax's own preservation policy: `AnyPreservationPolicy` of
`LatestN(keep)` and `BestN(keep_best)` on `best_metric` (recorded per step as
orbax checkpoint metrics), so the `keep` latest steps and the `keep_best` best
steps are both kept; a step without that metric (or with NaN) is never "best".

A save is atomic: orbax writes into `<step>.orbax-checkpoint-tmp-*` and renames it
when complete, so a save killed midway never becomes `latest_step()`. A step
damaged afterwards (a disk error, a hand edit) is caught on resume: `restore` and
`meta` fall back to the newest step that reads, moving each newer unreadable one
to `<directory>.unreadable/<step>` (never deleting it) with a one-line warning.

Example:
    >>> ckpt = Checkpointer(workdir + "/checkpoints", keep=3)
    >>> ckpt.save(step, state, {"iterator": it.position(), "ledger": total.to_dict()},
    ...           metrics={"heldout_percentile": 0.61})
    >>> state, meta = ckpt.restore(abstract_state=jax.eval_shape(lambda: state))
"""

import contextlib
import errno
import logging
import math
import os
import shutil
from collections.abc import Mapping
from typing import Any

import jax
import orbax.checkpoint as ocp
from flax import nnx
from orbax.checkpoint import checkpoint_managers

from wmrl_jax.models import api, lora
from wmrl_jax.models.config import config_from_dict
from wmrl_jax.train import stopping

__all__ = ["CheckpointError", "Checkpointer", "export_hf"]

_ITEMS = ("state", "meta")
log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """No checkpoint (or not the one asked for) can be read; says which and why, in one line."""


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:300]}"


class Checkpointer:
    """Keep-N + best-by-metric checkpoints of (state pytree, JSON metadata).

    Args:
        directory: root directory (created); one sub-directory per step.
        keep: number of latest steps kept (>= 1).
        best_metric: metric name ranking checkpoints (from `save(..., metrics=)`),
            or None to keep only the latest.
        best_mode: "max" or "min": which direction is better.
        keep_best: number of best steps kept in addition to the latest (>= 0).
        save_interval_steps: `save` writes only on multiples of this (or `force`).
        async_save: write arrays in a background thread (call `wait` before reading).
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        keep: int = 3,
        best_metric: str | None = "heldout_percentile",
        best_mode: str = "max",
        keep_best: int = 1,
        save_interval_steps: int = 1,
        async_save: bool = True,
    ):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        if keep_best < 0:
            raise ValueError(f"keep_best must be >= 0, got {keep_best}")
        if best_mode not in ("max", "min"):
            raise ValueError(f"best_mode must be 'max' or 'min', got {best_mode!r}")
        if save_interval_steps < 1:
            raise ValueError(f"save_interval_steps must be >= 1, got {save_interval_steps}")
        self.directory = os.path.abspath(os.fspath(directory))
        self.best_metric = best_metric
        self.best_mode = best_mode
        policies = [checkpoint_managers.LatestN(n=keep)]
        best_fn = None
        if best_metric is not None:
            best_fn = self._metric_value
            if keep_best > 0:
                policies.append(
                    checkpoint_managers.BestN(
                        get_metric_fn=best_fn,
                        reverse=best_mode == "min",
                        n=keep_best,
                        keep_checkpoints_without_metrics=False,
                    )
                )
        options = ocp.CheckpointManagerOptions(
            best_fn=best_fn,
            best_mode=best_mode,
            preservation_policy=checkpoint_managers.AnyPreservationPolicy(policies),
            save_interval_steps=save_interval_steps,
            enable_async_checkpointing=async_save,
            create=True,
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=_ITEMS)
        logging.getLogger("absl").addFilter(_QUIET_FULL_DISK)  # orbax logs through absl

    def _metric_value(self, metrics: Mapping[str, Any]) -> float:
        """The ranking value; missing or NaN ranks worst."""
        worst = -math.inf if self.best_mode == "max" else math.inf
        value = metrics.get(self.best_metric) if metrics else None
        if value is None:
            return worst
        value = float(value)
        return worst if math.isnan(value) else value

    def save(
        self,
        step: int,
        state: Any,
        meta: Mapping[str, Any],
        *,
        metrics: Mapping[str, float] | None = None,
        force: bool = False,
    ) -> bool:
        """Saves `state` and `meta` as `step` (asynchronously by default).

        Args:
            step: the step number (the state *after* this many updates).
            state: pytree of JAX arrays (None leaves allowed).
            meta: JSON-serialisable mapping (iterator position, ledger dict, ...).
            metrics: scalars recorded with the step; `best_metric` ranks it.
            force: save even if `step` is not a multiple of `save_interval_steps`.

        Returns:
            Whether a checkpoint was written.

        Raises:
            ValueError: the step already exists, or `meta` is not a mapping.
        """
        if not isinstance(meta, Mapping):
            raise ValueError(f"meta must be a mapping, got {type(meta).__name__}")
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(dict(meta))
        )
        if metrics is not None:
            metrics = {k: _json_float(v) for k, v in metrics.items()}
        elif self.best_metric is not None:
            metrics = {}  # orbax wants metrics when tracking best; empty ranks worst.
        with stopping.deferred(), self._disk_errors(f"writing checkpoint step {step}"):
            return self._manager.save(int(step), args=args, metrics=metrics, force=force)

    @contextlib.contextmanager
    def _disk_errors(self, doing: str):
        """A full disk (here or in orbax's writer thread) as one `CheckpointError` line."""
        try:
            yield
        except Exception as e:
            if not _no_space(e):
                raise
            raise CheckpointError(
                f"no space left on the device of {self.directory} while {doing}: free space "
                "there (the checkpoints saved so far are kept) and rerun to resume"
            ) from e

    def latest_step(self) -> int | None:
        """The newest complete step, or None (it may be unreadable: `restore` and
        `meta` then fall back to an older one)."""
        return self._manager.latest_step()

    def best_step(self) -> int | None:
        """The best step by `best_metric` (the latest if not tracking), or None."""
        return self._manager.best_step()

    def all_steps(self) -> list[int]:
        """All retained complete steps, ascending."""
        return sorted(self._manager.all_steps())

    def metrics(self, step: int) -> dict | None:
        """The metrics saved with `step` (None if there were none)."""
        return self._manager.metrics(step)

    def restore(self, step: int | None = None, *, abstract_state: Any) -> tuple[Any, dict]:
        """Restores `(state, meta)` of `step` (default: the newest readable step).

        With `step=None`, a newer step that cannot be read while an older one
        can (a corrupted save) is moved out of the way, to `<directory>.unreadable/`,
        never deleted, with a one-line warning naming it; the older step is restored.

        Args:
            step: step to restore, or None for the newest readable one.
            abstract_state: pytree with the structure of the saved state whose
                leaves are `jax.ShapeDtypeStruct` (with `.sharding` to place
                shards) or arrays; e.g. `jax.eval_shape(init_fn)` with shardings.

        Returns:
            (state, meta): the state in the target's dtypes and shardings, and the
            JSON metadata as saved.

        Raises:
            FileNotFoundError: no checkpoint (or not that step).
            CheckpointError: no step (or not `step`) can be read; one line per step.
        """
        abstract = jax.tree.map(_abstract_leaf, abstract_state)
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
        )

        def read(at: int) -> tuple[Any, dict]:
            out = self._manager.restore(at, args=args)
            return out["state"], dict(out["meta"])

        return self._read_newest(step, read)

    def meta(self, step: int | None = None) -> dict:
        """The JSON metadata of `step` (default: the newest readable step), without
        reading the state; falls back like `restore`.

        Raises:
            FileNotFoundError: no checkpoint (or not that step).
            CheckpointError: no step (or not `step`) has readable metadata.
        """
        args = ocp.args.Composite(meta=ocp.args.JsonRestore())
        return self._read_newest(
            step, lambda at: dict(self._manager.restore(at, args=args)["meta"])
        )

    def _read_newest(self, step: int | None, read):
        """`read(step)`, or with `step=None` that of the newest step it succeeds on.

        Only a step newer than one that reads is set aside as unreadable: when
        every step fails alike (e.g. an `abstract_state` of another structure),
        nothing is moved and the error says so.
        """
        if step is not None:
            step = self._existing(step)
            try:
                return read(step)
            except Exception as e:
                raise CheckpointError(
                    f"checkpoint step {step} in {self.directory} is unreadable: {_one_line(e)}"
                ) from e
        self._existing(None)
        failures = []
        for candidate in sorted(self._manager.all_steps(), reverse=True):
            try:
                out = read(candidate)
            except Exception as e:  # orbax raises many kinds for a damaged step
                failures.append((candidate, e))
                continue
            for bad, error in failures:
                where = self._set_aside(bad)
                log.warning(
                    "checkpoint step %d in %s is unreadable (%s); moved to %s, resuming from "
                    "step %d",
                    bad,
                    self.directory,
                    _one_line(error),
                    where,
                    candidate,
                )
            if failures:
                self._manager.reload()
            return out
        raise CheckpointError(
            f"no checkpoint in {self.directory} can be read: "
            + "; ".join(f"step {s}: {_one_line(e)}" for s, e in failures)
        ) from failures[0][1]

    def _existing(self, step: int | None) -> int:
        self.wait()
        if step is None:
            step = self.latest_step()
            if step is None:
                raise FileNotFoundError(f"no checkpoint in {self.directory}")
        elif step not in self._manager.all_steps():
            raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory}")
        return step

    def _set_aside(self, step: int) -> str:
        """Moves step `step`'s directory to `<directory>.unreadable/` (never deletes it)."""
        aside = self.directory.rstrip(os.sep) + ".unreadable"
        target = os.path.join(aside, str(step))
        suffix = 0
        while os.path.lexists(target):
            suffix += 1
            target = os.path.join(aside, f"{step}.{suffix}")
        if jax.process_index() == 0:
            os.makedirs(aside, exist_ok=True)
            os.replace(os.path.join(self.directory, str(step)), target)
        return target

    def wait(self) -> None:
        """Blocks until pending asynchronous saves (and their cleanup) finish."""
        with stopping.deferred(), self._disk_errors("finishing a checkpoint"):
            self._manager.wait_until_finished()

    def close(self) -> None:
        """Waits for pending saves and releases the manager."""
        with stopping.deferred(), self._disk_errors("finishing a checkpoint"):
            self._manager.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# How a full disk reads: an OSError, or tensorstore's RESOURCE_EXHAUSTED (orbax's array
# writes raise it as a ValueError naming the OS error, not as an OSError).
_NO_SPACE_TEXT = (os.strerror(errno.ENOSPC), f"os_error_code='{errno.ENOSPC}'")


def _no_space(error: BaseException | None) -> bool:
    """`error`, or an error it was raised from, is a full disk (ENOSPC)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            return True
        if any(text in str(error) for text in _NO_SPACE_TEXT):
            return True
        error = error.__cause__ or error.__context__
    return False


class _FullDiskTracebacks(logging.Filter):
    """Drops orbax's logged tracebacks of a full disk: the save or wait that meets it
    raises one `CheckpointError` line instead (orbax logs from its writer threads)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and _no_space(record.exc_info[1]))


_QUIET_FULL_DISK = _FullDiskTracebacks()


def _abstract_leaf(x):
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    if isinstance(x, jax.Array):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    return x


def _json_float(value) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def export_hf(
    model_graphdef: nnx.GraphDef | None,
    params: Any,
    raw_config: Mapping[str, Any],
    out_dir: str | os.PathLike,
    *,
    tokenizer: Any = None,
    overwrite: bool = False,
) -> str:
    """Exports a policy as a Hugging Face checkpoint directory.

    Writes config.json (`raw_config` verbatim), model.safetensors in the params'
    dtype and, if given, the tokenizer: a `transformers` tokenizer
    (`save_pretrained`) or a directory whose tokenizer files are copied. The
    directory is written next to `out_dir` and renamed into place when complete.

    A policy with LoRA adapters is exported merged: each adapted kernel is written
    as W + (alpha / r) A B (`models.lora.merge`), so the directory is a plain model
    of the base's architecture.

    Args:
        model_graphdef: the policy's `nnx.GraphDef`, checked against the graph
            built from `raw_config` (None skips the check; required with adapters).
        params: `nnx.State` or params pure dict (arrays may be sharded).
        raw_config: the `config.json` dictionary (e.g. `Model.raw_config`).
        out_dir: output directory; must not exist unless `overwrite`.
        tokenizer: optional tokenizer object or tokenizer directory.
        overwrite: replace an existing `out_dir`.

    Returns:
        `out_dir` as a string; `api.from_pretrained(out_dir)` reloads the policy.

    Raises:
        ValueError: the graph of `model_graphdef` differs from `raw_config`'s.
        FileExistsError: `out_dir` exists and not `overwrite`.
    """
    out_dir = os.fspath(out_dir)
    if os.path.exists(out_dir) and not overwrite:
        raise FileExistsError(f"{out_dir!r} exists; pass overwrite=True to replace it")
    config = config_from_dict(raw_config)
    if lora.has_adapters(params):
        if model_graphdef is None:
            raise ValueError("exporting LoRA adapters merged needs the policy's model_graphdef")
        model_graphdef, params = lora.merge(model_graphdef, params)
    pure = nnx.to_pure_dict(params) if isinstance(params, nnx.State) else params
    dtype = jax.tree_util.tree_leaves(pure)[0].dtype
    if model_graphdef is not None and model_graphdef != api.abstract_split(config, dtype)[0]:
        raise ValueError("model_graphdef does not match the graph built from raw_config")
    source_dir = os.fspath(tokenizer) if isinstance(tokenizer, str | os.PathLike) else None
    model = api.from_params(config, pure, raw_config=dict(raw_config), source_dir=source_dir)
    tmp_dir = out_dir.rstrip(os.sep) + ".export-tmp"
    shutil.rmtree(tmp_dir, ignore_errors=True)
    model.save_pretrained(tmp_dir)
    if tokenizer is not None and source_dir is None:
        tokenizer.save_pretrained(tmp_dir)
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    os.replace(tmp_dir, out_dir)
    return out_dir
