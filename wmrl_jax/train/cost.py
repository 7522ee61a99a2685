"""A modelled ledger: what a run would cost with a large LLM, beside the measured seconds.

On the CPU benchmarks generation, world-model passes and updates take almost
no time, so a small-batch real-execution arm looks nearly free per update.
With a 4B–9B model every token costs accelerator time. `CostModel` charges
tokens at the FLOPs of a configurable model size — 2·N per generated or
scored token (a forward), 6·N per trained token (forward and backward) — on an
accelerator of a given peak throughput and utilisation (MFU), and adds the
measured execution seconds, which do not depend on the model:

    modelled seconds = exec_seconds + (2·N·(gen_tokens + wm_tokens) + 6·N·train_tokens)
                                      / (peak_flops · mfu)

The token counts are the run's own, unless `lengths` gives an LLM's sequence
lengths per row: a tiny stand-in backbone (the recipe agent writes a program
in six tokens) then is charged as if each sample, world-model score and
trained row were as long as an LLM agent's (`samples × sample`,
`wm_rows × wm_row`, `train_rows × train_row` tokens).

With `execution_seconds` set, every execution is charged that fixed cost instead
of its recorded seconds (`executions × execution_seconds`): the execution-cost
axis of the study (an MLE-Dojo program runs for minutes, a replayed recipe for
1.5 s). A run that stops at an update cap (not a compute budget) has the same
trajectory under every cost, and its step log keeps the cumulative ledger of
every step (`ledger/<field>`, counts of executions, samples, world-model and
trained rows included), so `reprice` reads its compute under any cost
afterwards, with no rerun.

It is a model, labelled as such wherever it is reported (`ledger/modelled_*`);
the measured ledger stays the headline of a run.

Example:
    >>> model = CostModel(params=4e9, peak_flops=ACCELERATORS["A100"], mfu=0.4)
    >>> round(model.seconds(Ledger(gen_tokens=1e6, exec_seconds=10.0)), 1)
    74.1
    >>> fixed = dataclasses.replace(model, execution_seconds=30.0)
    >>> round(fixed.seconds(Ledger(gen_tokens=1e6, executions=2, exec_seconds=10.0)), 1)
    124.1
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import ml_collections
import numpy as np

from wmrl_jax.train.ledger import Ledger

# Dense bf16 peak FLOP/s per accelerator (vendor figures, no sparsity).
ACCELERATORS = {"A100": 312e12, "H100": 989e12, "H200": 989e12, "B200": 2250e12}


@dataclasses.dataclass(frozen=True)
class TokenLengths:
    """An LLM agent's tokens per row: a sample (prompt + completion), a world-model
    score (prompt + answer), a trained row (prompt + completion)."""

    sample: float
    wm_row: float
    train_row: float

    def __post_init__(self):
        if min(self.sample, self.wm_row, self.train_row) <= 0:
            raise ValueError(f"token lengths must be > 0, got {self}")


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Token costs of an N-parameter model on one accelerator (see the module docstring).

    Attributes:
      params: N, the model's parameter count.
      peak_flops: the accelerator's peak FLOP/s.
      mfu: model FLOPs utilisation in (0, 1].
      lengths: tokens per row to charge instead of the run's own counts.
      execution_seconds: a fixed cost per execution instead of the recorded seconds
        (None: the recorded ones).
      charge_repeats: charge the ledger's cached repeats (programs already executed
        on their task, answered free from the run's cache) as executions too, at
        `execution_seconds` (which it needs): the price of the same run on a
        benchmark whose programs never recur, or without the cache.
    """

    params: float
    peak_flops: float
    mfu: float
    lengths: TokenLengths | None = None
    execution_seconds: float | None = None
    charge_repeats: bool = False

    def __post_init__(self):
        if not (self.params > 0 and self.peak_flops > 0 and 0 < self.mfu <= 1):
            raise ValueError(f"need params > 0, peak_flops > 0, 0 < mfu <= 1; got {self}")
        if self.execution_seconds is not None and not self.execution_seconds > 0:
            raise ValueError(f"execution_seconds must be > 0 or None, got {self.execution_seconds}")
        if self.charge_repeats and self.execution_seconds is None:
            raise ValueError("charge_repeats needs a fixed execution_seconds (a cached repeat "
                             "has no recorded seconds)")  # fmt: skip

    def tokens(self, ledger: Ledger) -> tuple[float, float]:
        """(forward-only tokens, trained tokens) charged for `ledger`."""
        if self.lengths is None:
            return ledger.gen_tokens + ledger.wm_tokens, ledger.train_tokens
        n = self.lengths
        forward = ledger.samples * n.sample + ledger.wm_rows * n.wm_row
        return forward, ledger.train_rows * n.train_row

    def token_seconds(self, ledger: Ledger) -> float:
        """Accelerator seconds of the ledger's tokens."""
        forward, trained = self.tokens(ledger)
        flops = 2 * self.params * forward + 6 * self.params * trained
        return flops / (self.peak_flops * self.mfu)

    def exec_seconds(self, ledger: Ledger) -> float:
        """Execution seconds charged: `executions × execution_seconds` (the cached repeats
        added with `charge_repeats`), or the recorded."""
        if self.execution_seconds is None:
            return float(ledger.exec_seconds)
        runs = float(ledger.executions) + (float(ledger.cached) if self.charge_repeats else 0.0)
        return runs * float(self.execution_seconds)

    def seconds(self, ledger: Ledger) -> float:
        """Modelled compute: token seconds plus the execution (and tool) seconds charged."""
        return self.token_seconds(ledger) + self.exec_seconds(ledger) + float(ledger.tool_seconds)


def reprice(
    entries: Sequence[Mapping[str, float]],
    model: CostModel,
    *,
    execution_seconds: float | None = None,
    prefix: str = "",
) -> np.ndarray:
    """The modelled compute of recorded cumulative ledgers under a fixed execution cost.

    Args:
      entries: cumulative ledgers as mappings of `Ledger` fields, each under
        `prefix` (a run's step log: ``prefix="ledger/"``; its evaluation history:
        ``""``); a field an entry lacks counts 0.
      model: the token costs (its own `execution_seconds` is replaced).
      execution_seconds: seconds charged per execution; None: the recorded seconds.

    Returns:
      float64 [len(entries)]: `model.seconds` of each entry under that cost.

    Example:
      >>> steps = [{"ledger/executions": 8.0, "ledger/exec_seconds": 12.0}]
      >>> float(reprice(steps, model, execution_seconds=300.0, prefix="ledger/")[0])
      2400.0
    """
    model = dataclasses.replace(model, execution_seconds=execution_seconds)
    fields = Ledger._fields
    return np.array(
        [
            model.seconds(Ledger(**{f: float(e.get(prefix + f, 0.0)) for f in fields}))
            for e in entries
        ],
        np.float64,
    )


def from_config(config: ml_collections.ConfigDict) -> CostModel | None:
    """The `config.cost_model` of a run, or None when `params` is 0 (off)."""
    c = config.cost_model
    if not c.params:
        return None
    if c.accelerator not in ACCELERATORS:
        raise ValueError(
            f"config.cost_model.accelerator must be one of {tuple(ACCELERATORS)}, "
            f"got {c.accelerator!r}"
        )
    given = (float(c.sample_tokens), float(c.wm_tokens), float(c.train_tokens))
    lengths = TokenLengths(*given) if any(given) else None  # Some but not all: an error.
    fixed = float(c.execution_seconds) or None  # 0: the recorded seconds.
    return CostModel(float(c.params), ACCELERATORS[c.accelerator], float(c.mfu), lengths, fixed)
