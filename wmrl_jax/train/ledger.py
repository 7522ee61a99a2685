"""The compute ledger: tokens, seconds and executions, per step and cumulative.

The ledger is host-side bookkeeping in Python floats (float64), never traced:
the training loop measures each phase, builds one `Ledger` per step with a
`LedgerStep`, and adds it to the running total with `Ledger.add`.

What is counted (`Ledger.compute_seconds`, the headline figure):

* `gen_seconds`: wall seconds of policy sampling (generation) on the accelerator;
* `wm_seconds`: wall seconds of the world-model prediction pass;
* `exec_seconds`: the *sum over executed programs* of their execution seconds,
  as measured by the sandbox or as recorded in the tabular benchmark by the
  replay executor. Executions that run in parallel each count in full, so this
  is resource-seconds, not elapsed time;
* `tool_seconds`: the same resource-seconds for the sandbox tool calls of
  multi-turn episodes (`wmrl_jax.sandbox.tools`: data information, validation
  on a sample), counted apart from `exec_seconds` because they are not
  executions of submitted programs: every arm pays them for every sample. A
  caller that times the rollout as `gen_seconds` leaves out the wall seconds
  it spent waiting on them (`Rollout.tool_wait_seconds`).

`train_seconds` (the gradient step) and `accelerator_seconds` (device-seconds,
when the caller knows them, e.g. wall seconds times the number of chips) are
recorded but are *not* part of `compute_seconds`: the two arms of a comparison
(WMRL and real-execution GRPO) run the same train step, and the headline
compares the cost of producing rewards. Report them separately.

Example:
    >>> total = Ledger()
    >>> step = LedgerStep()
    >>> with step.timed("gen_seconds"):
    ...     tokens = sample(...)            # block_until_ready inside the block
    >>> step.add(gen_tokens=tokens.size, executions=4, exec_seconds=12.5)
    >>> total = total.add(step.ledger())
    >>> total.compute_seconds
"""

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Mapping
from typing import NamedTuple

__all__ = ["Ledger", "LedgerStep", "Timer"]


class Ledger(NamedTuple):
    """Counts for one step, or cumulative totals (same type; add to accumulate).

    Attributes:
        gen_tokens: sampled (generated) policy tokens.
        gen_seconds: wall seconds of generation.
        wm_tokens: tokens the world model processed (prompts and readouts).
        wm_seconds: wall seconds of world-model prediction.
        executions: programs executed (sandbox or replayed).
        exec_seconds: summed execution seconds of those programs.
        train_seconds: wall seconds of the train step (not in `compute_seconds`).
        accelerator_seconds: device-seconds when known, else 0 (not in
            `compute_seconds`).
        cached: executions answered from the run's execution cache (a repeat of
            a program already executed on that task): reported, not charged.
        train_tokens: tokens through the train step's forward and backward
            (over all epochs); the modelled cost reads it (`train.cost`).
        samples: policy samples generated.
        wm_rows: samples the world model scored.
        train_rows: rows through the train step (over all epochs), auxiliary
            world-model rows included. The modelled cost can charge these at
            an LLM's sequence lengths (`train.cost.CostModel.lengths`).
        tool_calls: sandbox tool calls of multi-turn episodes.
        tool_seconds: their summed sandbox seconds (in `compute_seconds`).
    """

    gen_tokens: float = 0.0
    gen_seconds: float = 0.0
    wm_tokens: float = 0.0
    wm_seconds: float = 0.0
    executions: float = 0.0
    exec_seconds: float = 0.0
    train_seconds: float = 0.0
    accelerator_seconds: float = 0.0
    cached: float = 0.0
    train_tokens: float = 0.0
    samples: float = 0.0
    wm_rows: float = 0.0
    train_rows: float = 0.0
    tool_calls: float = 0.0
    tool_seconds: float = 0.0

    def add(self, other: "Ledger") -> "Ledger":
        """Fieldwise sum (e.g. cumulative total plus this step)."""
        if not isinstance(other, Ledger):
            raise TypeError(f"can only add a Ledger, got {type(other).__name__}")
        return Ledger(*(float(a) + float(b) for a, b in zip(self, other, strict=True)))

    def __add__(self, other):  # tuple `+` would concatenate: make it the fieldwise sum.
        return self.add(other)

    @property
    def compute_seconds(self) -> float:
        """Headline compute: generation + world-model + execution (and tool) seconds."""
        sandbox = float(self.exec_seconds) + float(self.tool_seconds)
        return float(self.gen_seconds) + float(self.wm_seconds) + sandbox

    def with_device_seconds(self, devices: int) -> "Ledger":
        """This step's ledger with `accelerator_seconds` set to the wall seconds of
        generation, the world model and the train step times `devices` (the
        accelerators they ran on; 0 on a CPU host, where nothing is charged)."""
        busy = float(self.gen_seconds) + float(self.wm_seconds) + float(self.train_seconds)
        return self._replace(accelerator_seconds=busy * devices)

    @property
    def tokens(self) -> float:
        """Generation plus world-model tokens."""
        return float(self.gen_tokens) + float(self.wm_tokens)

    def to_dict(self) -> dict[str, float]:
        """Plain dict of Python floats; `Ledger.from_dict(l.to_dict()) == l` exactly."""
        return {name: float(value) for name, value in zip(self._fields, self, strict=True)}

    @classmethod
    def from_dict(cls, values: Mapping[str, float]) -> "Ledger":
        """Inverse of `to_dict`; absent fields are 0 and unknown fields raise.

        Raises:
            ValueError: on an unknown field or a non-finite / negative value.
        """
        unknown = set(values) - set(cls._fields)
        if unknown:
            raise ValueError(f"unknown ledger fields {sorted(unknown)}; known: {cls._fields}")
        out = {}
        for name in cls._fields:
            value = float(values.get(name, 0.0))
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"ledger field {name!r} must be finite and >= 0, got {value}")
            out[name] = value
        return cls(**out)


class Timer:
    """Measures the seconds of a `with` block (`time.perf_counter` unless `clock` is given).

    JAX dispatch is asynchronous: block on the results (`jax.block_until_ready`)
    inside the block, or the time of the device work is not measured.

    Example:
        >>> with Timer() as t:
        ...     work()
        >>> t.seconds
    """

    def __init__(self, *, clock: Callable[[], float] = time.perf_counter):
        self._clock = clock
        self._start = None
        self.seconds = 0.0

    def __enter__(self) -> "Timer":
        self._start = self._clock()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = float(self._clock() - self._start)


class LedgerStep:
    """Mutable host-side builder of one step's `Ledger`.

    Example:
        >>> step = LedgerStep()
        >>> with step.timed("wm_seconds"):
        ...     predictions = wm_predict(...)
        >>> step.add(wm_tokens=1024)
        >>> step.ledger().wm_tokens
        1024.0
    """

    def __init__(self, *, clock: Callable[[], float] = time.perf_counter):
        self._clock = clock
        self._values = dict.fromkeys(Ledger._fields, 0.0)

    def add(self, **amounts: float) -> None:
        """Adds amounts to named fields (e.g. `executions=4, exec_seconds=12.5`).

        Raises:
            ValueError: unknown field, or a negative / non-finite amount.
        """
        for name, amount in amounts.items():
            if name not in self._values:
                raise ValueError(f"unknown ledger field {name!r}; known: {Ledger._fields}")
            amount = float(amount)
            if not math.isfinite(amount) or amount < 0:
                raise ValueError(f"amount for {name!r} must be finite and >= 0, got {amount}")
            self._values[name] += amount

    @contextlib.contextmanager
    def timed(self, field: str) -> Iterator[Timer]:
        """Adds the seconds of the `with` block to `field` (a `*_seconds` field)."""
        if not field.endswith("_seconds") or field not in self._values:
            raise ValueError(f"{field!r} is not a seconds field of the ledger")
        timer = Timer(clock=self._clock)
        with timer:
            yield timer
        self.add(**{field: timer.seconds})

    def ledger(self) -> Ledger:
        """The step's counts so far."""
        return Ledger(**self._values)
