"""The console: one line per step and evaluation, an ETA from this process's steps."""

import io
import math

from wmrl_jax.train.console import Console, duration


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_lines_and_eta():
    out, clock = io.StringIO(), Clock()
    console = Console(stream=out, clock=clock)
    console.start(0, 40, arm="wmrl", environment="replay")
    clock.t += 30.0  # 10 s per step over 3 steps
    console.step(3, {"reward/fed_mean": 0.25, "ledger/executions": 16, "train/kl": 0.001,
                     "ledger/compute_seconds": 300.0})  # fmt: skip
    console.step(4, {"eval/heldout_percentile": 0.4321, "eval/valid_fraction": 1.0})
    lines = out.getvalue().splitlines()
    assert lines[0] == "train  arm wmrl, 40 steps, outcomes from replay"
    assert lines[1].startswith("step   3/40  reward +0.250  exec    16 (5.0 min compute)")
    assert lines[1].endswith("ETA 6.2 min")  # 37 steps left at 10 s
    assert "nan" in lines[2]  # an undefined reward prints as nan, never crashes
    assert lines[3] == "eval   4/40  held-out percentile 0.432 (valid 1.00)"


def test_resumed_run_counts_only_its_own_steps():
    out, clock = io.StringIO(), Clock()
    console = Console(stream=out, clock=clock)
    console.start(30, 40, arm="real", environment="docker")
    assert "resuming after step 30" in out.getvalue()
    clock.t += 20.0
    assert console.eta(32) == 80.0  # 10 s per step, 8 left
    assert math.isnan(console.eta(30))


def test_disabled_console_prints_nothing(capsys):
    console = Console(enabled=False)
    console.start(0, 2, arm="wmrl", environment="local")
    console.step(1, {})
    assert capsys.readouterr().out == ""


def test_duration():
    assert (duration(42), duration(210), duration(4320), duration(math.nan)) == (
        "42 s", "3.5 min", "1.2 h", "?",
    )  # fmt: skip
