"""A run's progress: its cumulative ledger, evaluations and step log, and their summary.

The training loop (`wmrl_jax.train.loop.Trainer.run`) adds each step's ledger
and metrics here, and the checkpoints carry it (`to_meta` / `from_meta`), so a
resumed run continues the same ledger, history and step log.

Example:
    >>> progress = Progress(accelerators=0, cost_model=None)
    >>> metrics = progress.add_step(step_ledger)     # the ledger/... scalars
    >>> progress.log_step(1, {**train_metrics, **metrics})
    >>> progress.summary(arm="wmrl", environment="replay")
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from wmrl_jax.train import multihost
from wmrl_jax.train.cost import CostModel
from wmrl_jax.train.ledger import Ledger

__all__ = ["Progress"]


@dataclasses.dataclass
class Progress:
    """The run's ledger so far, its evaluations (`history`) and per-step metrics (`steps`).

    Attributes:
      accelerators: chips the step's device work runs on (0 on a CPU host: nothing
        is charged as device-seconds).
      cost_model: the modelled ledger beside the measured one (`train.cost`), or None.
      ledger: the cumulative compute.
      history: one entry per evaluation: the step, the ledger then, the scalars.
      steps: one entry per step: the step and its metrics.
      last_metrics: the last step's metrics (the summary's calibration).
    """

    accelerators: int
    cost_model: CostModel | None
    ledger: Ledger = Ledger()
    history: list[dict] = dataclasses.field(default_factory=list)
    steps: list[dict] = dataclasses.field(default_factory=list)
    last_metrics: dict[str, float] = dataclasses.field(default_factory=dict)

    def add_step(self, measured: Ledger) -> tuple[Ledger, dict[str, float]]:
        """Adds one step's measured ledger; returns `(the step's ledger, ledger metrics)`.

        The step's ledger gets its device-seconds and is process 0's everywhere, so the
        compute budget stops every process at the same step.
        """
        step = Ledger.from_dict(
            multihost.agree(measured.with_device_seconds(self.accelerators).to_dict())
        )
        self.ledger = self.ledger.add(step)
        metrics = {f"ledger/{k}": float(v) for k, v in self.ledger.to_dict().items()}
        metrics["ledger/compute_seconds"] = float(self.ledger.compute_seconds)
        if self.cost_model is not None:
            metrics["ledger/modelled_compute_seconds"] = self.cost_model.seconds(self.ledger)
        return step, metrics

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        """Keeps the step's metrics (the same dict: an evaluation may join it later)."""
        self.last_metrics = metrics
        self.steps.append({"step": step, **metrics})

    def log_evaluation(self, step: int, scalars: Mapping[str, float]) -> None:
        self.history.append({"step": step, **self.ledger.to_dict(), **scalars})

    def to_meta(self) -> dict:
        """The checkpoint's share: the ledger, the history and the step log."""
        return {"ledger": self.ledger.to_dict(), "history": self.history, "steps": self.steps}

    def restore(self, meta: Mapping) -> None:
        """Continues from a checkpoint's meta (`to_meta`)."""
        self.ledger = Ledger.from_dict(meta["ledger"])
        self.history = list(meta.get("history", []))
        self.steps = list(meta.get("steps", []))

    def summary(self, *, arm: str, environment: str) -> dict:
        """Held-out percentile before and after, the ledger, the last calibration."""
        first, last = self.history[0], self.history[-1]
        return {
            "arm": arm,
            "environment": environment,
            "heldout_before": first["eval/heldout_percentile"],
            "heldout_after": last["eval/heldout_percentile"],
            "ledger": self.ledger.to_dict(),
            "compute_seconds": self.ledger.compute_seconds,
            "calibration": {
                k: v for k, v in self.last_metrics.items() if k.startswith("correction/")
            },
            "history": self.history,
            "steps": self.steps,
        }
