"""The trainer across processes: side effects once, on process 0, their results everywhere.

Every trainer process runs the same loop over one mesh spanning all of them
(`wmrl_jax.train.distributed`). What is computed on the mesh (sampling, the
world-model pass, the correction, the train step) is one SPMD program: every
process takes part and reads the same replicated results. The batch is the
same on every process: its tasks and keys are pure functions of the seed and
the step, and the rollout is sampled on the mesh from the same params with the
same key; each process then hands the train step only its own rows
(`place_batch`, `jax.make_array_from_process_local_data`).

What touches the world happens once, on process 0, and its result is sent to
the others (`agree`, a broadcast of JSON through `broadcast_one_to_all`):

* executing anchors: `SharedOutcomes` wraps the outcome source. On process 0
  it records every outcome the source answered (retries included, in order);
  on the others its `submit` returns futures that `exchange` resolves with
  process 0's answers, so each process's `Runner` (its execution cache,
  replicate counts, partners) and agent (`observe`) go through the same states;
* held-out evaluations (`evaluation_source`, then `agree` on the metrics);
* wall-clock seconds: the step's ledger is process 0's, so the compute budget
  stops every process at the same step;
* files: metrics, console, summary and Hugging Face exports are written by
  process 0; orbax checkpoints are written by every process together.

With one process every function here is a pass-through.

Example:
    >>> spec = join(config)                      # before any other JAX call
    >>> shared = SharedOutcomes(source if distributed.is_primary() else None)
    >>> pending = runner.submit(tasks, programs, rows, g)   # runner over `shared`
    >>> got = shared.exchange(lambda: runner.collect(pending, tasks, programs, g))
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import math
from collections.abc import Callable, Iterator
from typing import TypeVar

import jax
import numpy as np
from jax.experimental import multihost_utils

from wmrl_jax.envs.outcomes import Outcome, failed_outcome
from wmrl_jax.train import distributed
from wmrl_jax.train.config import ConfigError

__all__ = [
    "SharedOutcomes",
    "agree",
    "check_mesh",
    "gather",
    "join",
    "place_batch",
    "primary_first",
]

T = TypeVar("T")
# Payloads are padded to a power of two at least this long, so that the broadcast
# compiles for a handful of shapes in a run, not one per step.
_MIN_PAYLOAD = 1024


def join(config) -> distributed.ProcessSpec:
    """Resolves `config.distributed` and joins `jax.distributed` when it names several
    processes (a no-op for one, or when this process has joined already).

    Raises:
        ConfigError: an incomplete layout, a layout this process cannot join (JAX's
            backends are already up), or one that disagrees with the joined one.
    """
    try:
        spec = distributed.resolve(config.distributed)
    except ValueError as e:
        raise ConfigError(f"config.distributed: {e}") from e
    if spec.num_processes == 1:
        return spec
    if not jax.distributed.is_initialized():
        try:
            distributed.initialize(spec, timeout_s=int(config.distributed.initialization_timeout_s))
        except RuntimeError as e:
            raise ConfigError(
                f"process {spec.process_id} of {spec.num_processes} (from {spec.source}) could "
                f"not join: {' '.join(str(e).split())[:300]} (join before any other JAX call: "
                "multihost.join(config) or distributed.initialize)"
            ) from e
    if (jax.process_count(), jax.process_index()) != (spec.num_processes, spec.process_id):
        raise ConfigError(
            f"config.distributed says process {spec.process_id} of {spec.num_processes} "
            f"(from {spec.source}); JAX joined as process {jax.process_index()} of "
            f"{jax.process_count()}"
        )
    return spec


def check_mesh(mesh: jax.sharding.Mesh) -> None:
    """Raises `ConfigError` unless `mesh` holds devices of every process (each process
    runs the same SPMD program on it, so each must own part of it)."""
    count = jax.process_count()
    owners = {d.process_index for d in mesh.devices.flat}
    if count > 1 and owners != set(range(count)):
        raise ConfigError(
            f"config.mesh ({dict(mesh.shape)}) uses {mesh.devices.size} of the "
            f"{jax.device_count()} devices, those of processes {sorted(owners)}; with "
            f"{count} processes the mesh must span all of them"
        )


def agree(value: T) -> T:
    """Process 0's `value` (JSON-able: dicts, lists, str, finite or NaN floats) on every
    process; every process must call it at the same point. One process: `value`."""
    if jax.process_count() == 1:
        return value
    primary = distributed.is_primary()
    data = json.dumps(value).encode() if primary else b""
    size = distributed.broadcast_from_primary(np.asarray(len(data), np.int32))
    size = int(size)
    padded = max(_MIN_PAYLOAD, 1 << max(size - 1, 0).bit_length())
    buffer = np.zeros(padded, np.uint8)
    buffer[: len(data)] = np.frombuffer(data, np.uint8)
    received = distributed.broadcast_from_primary(buffer)
    return json.loads(bytes(np.asarray(received[:size])).decode())


@contextlib.contextmanager
def primary_first(name: str) -> Iterator[None]:
    """Runs the block on process 0 before the others (e.g. building a cache on a shared
    filesystem once, which the others then read)."""
    if not distributed.is_primary():
        distributed.barrier(f"{name}:primary-done")
    yield
    if distributed.is_primary():
        distributed.barrier(f"{name}:primary-done")


def place_batch(batch: dict, train_step) -> dict:
    """The train step's batch as global arrays, each process giving only its rows.

    Args:
        batch: the whole batch, the same on every process: arrays of shape [B, ...].
        train_step: the `step.TrainStep` (its `spec` and `batch_shardings`).

    Returns:
        `jax.Array`s of shape [B, ...] in the step's batch shardings and dtypes.
    """
    rows_total = len(batch["tokens"])
    rows = distributed.process_rows(train_step.batch_shardings["tokens"], rows_total)
    local = {k: np.asarray(batch[k][rows], dtype) for k, (_, dtype) in train_step.spec.items()}
    return distributed.global_batch(local, train_step.batch_shardings, global_rows=rows_total)


def gather(tree):
    """A pytree of (possibly cross-process sharded) arrays as numpy on every process."""
    if jax.process_count() == 1:
        return tree
    return multihost_utils.process_allgather(tree, tiled=True)


def _encode(out: Outcome) -> list:
    return [out.status, *(float(v) for v in out[1:5]), out.message]


def _decode(row: list) -> Outcome:
    return Outcome(row[0], *(math.nan if v is None else float(v) for v in row[1:5]), row[5])


class _Unexecuted:
    """The evaluation source of processes other than 0: their results are replaced by
    process 0's (`agree`), so nothing runs here."""

    def submit(self, task, source: str, *, replicate: int = 0) -> concurrent.futures.Future:
        del task, source, replicate
        future = concurrent.futures.Future()
        future.set_result(failed_outcome("infra_error", message="executed on process 0"))
        return future


class SharedOutcomes:
    """An outcome source executed by process 0 alone, answering every process alike.

    Args:
        source: the real `OutcomeSource` on process 0; on the others None (nothing is
            built, started or executed there) or one that is never used, only closed.
        environment: how the console and summary name the source (default: its type).

    Attributes:
        fingerprint, num_replicates, environment: process 0's source's, on every process.
    """

    def __init__(self, source, *, environment: str = ""):
        self.primary = distributed.is_primary()
        if self.primary and source is None:
            raise ValueError("process 0 needs the outcome source")
        self._given = source  # Closed by `close`, whichever process was given one.
        self.source = source if self.primary else None
        info = {}
        if self.primary:
            info = {
                "fingerprint": source.fingerprint,
                "num_replicates": int(source.num_replicates),
                "environment": environment or type(source).__name__,
            }
        info = agree(info)
        self.fingerprint = info["fingerprint"]
        self.num_replicates = info["num_replicates"]
        self.environment = info["environment"]
        self._asked: list[concurrent.futures.Future] = []  # process 0: in submission order
        self._waiting: list[concurrent.futures.Future] = []  # others: not yet answered
        self._answers: list[Outcome] = []  # others: process 0's later answers (retries)

    def submit(self, task, source: str, *, replicate: int = 0) -> concurrent.futures.Future:
        """Process 0: starts the execution. Others: a future `exchange` resolves."""
        if self.primary:
            future = self.source.submit(task, source, replicate=replicate)
            self._asked.append(future)
            return future
        future = concurrent.futures.Future()
        if self._answers:  # A retry inside `collect`: process 0 made it too.
            future.set_result(self._answers.pop(0))
        else:
            self._waiting.append(future)
        return future

    def exchange(self, collect: Callable[[], T]) -> T:
        """Runs `collect` (which waits on this step's submissions) everywhere, with
        process 0's answers: process 0 collects first and sends every answer its
        source gave (an error it raised, too); the others receive them, resolve
        their futures in submission order and collect the same results.

        Raises:
            RuntimeError: process 0's `collect` raised (on every other process), or
                a process submitted more than process 0 answered.
        """
        if self.primary:
            try:
                result = collect()
            except Exception as e:
                agree({"error": f"{type(e).__name__}: {e}"})
                raise
            finally:
                asked, self._asked = self._asked, []
            agree({"answers": [_encode(f.result()) for f in asked]})
            return result
        payload = agree(None)
        if "error" in payload:
            self._waiting = []
            raise RuntimeError(f"process 0 stopped: {payload['error']}")
        answers = [_decode(row) for row in payload["answers"]]
        if len(answers) < len(self._waiting):
            raise RuntimeError(
                f"process 0 answered {len(answers)} executions, this process asked "
                f"{len(self._waiting)}: out of step"
            )
        waiting, self._waiting = self._waiting, []
        for future, answer in zip(waiting, answers, strict=False):
            future.set_result(answer)
        self._answers = answers[len(waiting) :]
        result = collect()
        unused, self._answers = len(self._answers), []
        if unused or self._waiting:
            raise RuntimeError(
                f"{unused} of process 0's answers unused, {len(self._waiting)} submissions "
                "unanswered: out of step with process 0"
            )
        return result

    def evaluation_source(self):
        """The source held-out evaluations submit to: process 0's real one; a stand-in
        elsewhere (agree on the evaluation's metrics afterwards)."""
        return self.source if self.primary else _Unexecuted()

    def close(self) -> None:
        """Closes the source this process was given (process 0's executes)."""
        if self._given is not None:
            self._given.close()
