"""A console a person can read: one line per step, one per evaluation, with an ETA.

    setup  tasks: built-in suite (built once per version, a few minutes)
    step  12/40  reward +0.214  exec    14 (2.1 min compute)  kl 0.0003  ETA 70 s
    eval  20/40  held-out percentile 0.431 (valid 1.00)

Lines go to stdout, flushed, so a log file or a notebook shows them as they
happen. Everything else (TensorBoard, `metrics.jsonl`) is the metric writer's.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping


def duration(seconds: float) -> str:
    """`seconds` as a short human duration ("42 s", "3.5 min", "1.2 h").

    Example:
      >>> duration(42), duration(210), duration(4320)
      ('42 s', '3.5 min', '1.2 h')
    """
    if not math.isfinite(seconds):
        return "?"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


class Console:
    """Prints the run's progress; a disabled console prints nothing.

    Args:
      enabled: print at all.
      stream: where to (default stdout).
      clock: seconds clock (tests pass a fake).
    """

    def __init__(self, *, enabled: bool = True, stream=None, clock=time.perf_counter):
        self.enabled = enabled
        self.stream = stream
        self.clock = clock
        self.total = 0
        self._start_step = 0
        self._t0 = 0.0

    def _print(self, line: str) -> None:
        if self.enabled:
            print(line, file=self.stream or sys.stdout, flush=True)

    def note(self, text: str) -> None:
        """A setup line (what the run is doing before its first step)."""
        self._print(f"setup  {text}")

    def start(self, start_step: int, total: int, *, arm: str, environment: str) -> None:
        """Announces the run (or its resumption) and starts the ETA clock."""
        self.total, self._start_step, self._t0 = int(total), int(start_step), self.clock()
        resumed = f", resuming after step {start_step}" if start_step else ""
        self._print(f"train  arm {arm}, {total} steps, outcomes from {environment}{resumed}")

    def eta(self, step: int) -> float:
        """Seconds left, from the mean time of the steps this process ran."""
        done = step - self._start_step
        if done <= 0:
            return math.nan
        return (self.clock() - self._t0) / done * (self.total - step)

    def step(self, step: int, metrics: Mapping[str, float]) -> None:
        """One line for a finished step (and one more if it was evaluated)."""
        width = len(str(self.total))
        reward = metrics.get("reward/fed_mean", math.nan)
        execs = metrics.get("ledger/executions", 0.0)
        compute = metrics.get("ledger/compute_seconds", 0.0)
        kl = metrics.get("train/kl", math.nan)
        self._print(
            f"step  {step:>{width}}/{self.total}  reward {reward:+.3f}  exec {execs:>5.0f} "
            f"({duration(compute)} compute)  kl {kl:.4f}  ETA {duration(self.eta(step))}"
        )
        if "eval/heldout_percentile" in metrics:
            self.evaluation(step, metrics)

    def evaluation(self, step: int, metrics: Mapping[str, float]) -> None:
        """One line for a held-out evaluation."""
        width = len(str(self.total))
        pct = metrics["eval/heldout_percentile"]
        # No usable execution: no percentile at all (never a 0.000 that looks measured).
        shown = f"{pct:.3f}" if math.isfinite(pct) else "n/a"
        masked = int(metrics.get("eval/infra_errors", 0))
        infra = f", {masked} infrastructure errors masked" if masked else ""
        self._print(
            f"eval  {step:>{width}}/{self.total}  held-out percentile {shown} "
            f"(valid {metrics.get('eval/valid_fraction', math.nan):.2f}{infra})"
        )
