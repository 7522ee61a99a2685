"""Ledger arithmetic, round trips and the timer (with a fake clock: no timing asserts)."""

import json
import math

import pytest

from wmrl_jax.train.ledger import Ledger, LedgerStep, Timer


class FakeClock:
    def __init__(self, ticks):
        self._ticks = iter(ticks)

    def __call__(self):
        return next(self._ticks)


def test_add_and_compute_seconds_by_hand():
    a = Ledger(
        gen_tokens=100,
        gen_seconds=1.5,
        wm_tokens=40,
        wm_seconds=0.25,
        executions=2,
        exec_seconds=10.0,
        train_seconds=3.0,
        accelerator_seconds=6.0,
    )
    b = Ledger(gen_tokens=10, gen_seconds=0.5, executions=1, exec_seconds=2.0)
    total = a.add(b)
    assert total == Ledger(110.0, 2.0, 40.0, 0.25, 3.0, 12.0, 3.0, 6.0)
    assert a + b == total  # fieldwise, not tuple concatenation
    assert len(a + b) == len(Ledger._fields)
    # 2.0 + 0.25 + 12.0; train and accelerator seconds are not counted.
    assert total.compute_seconds == 14.25
    assert total.tokens == 150.0
    assert Ledger().compute_seconds == 0.0


def test_cumulative_total_over_steps():
    total = Ledger()
    for i in range(1, 5):
        total = total.add(Ledger(executions=i, exec_seconds=0.5 * i))
    assert total.executions == 10.0
    assert total.exec_seconds == 5.0


def test_round_trip_is_exact_through_json():
    ledger = Ledger(
        gen_tokens=1e12 + 1, gen_seconds=0.1 + 0.2, wm_seconds=1 / 3, exec_seconds=2.0**-40
    )
    again = Ledger.from_dict(json.loads(json.dumps(ledger.to_dict())))
    assert again == ledger
    assert all(type(v) is float for v in again)
    assert Ledger.from_dict({"executions": 3}) == Ledger(executions=3.0)


@pytest.mark.parametrize(
    "values, match",
    [
        ({"gpu_seconds": 1.0}, "unknown"),
        ({"gen_seconds": -1.0}, ">= 0"),
        ({"wm_seconds": math.nan}, "finite"),
    ],
)
def test_from_dict_rejects_bad_input(values, match):
    with pytest.raises(ValueError, match=match):
        Ledger.from_dict(values)


def test_add_rejects_non_ledger():
    with pytest.raises(TypeError):
        Ledger().add((1.0,) * 8)


def test_ledger_step_timed_and_add():
    step = LedgerStep(clock=FakeClock([10.0, 12.5, 20.0, 20.25]))
    with step.timed("gen_seconds") as t:
        pass
    assert t.seconds == 2.5
    with step.timed("wm_seconds"):
        pass
    step.add(gen_tokens=64, executions=2, exec_seconds=7.0)
    step.add(exec_seconds=1.0)
    assert step.ledger() == Ledger(
        gen_tokens=64.0, gen_seconds=2.5, wm_seconds=0.25, executions=2.0, exec_seconds=8.0
    )
    assert step.ledger().compute_seconds == 10.75


def test_ledger_step_errors():
    step = LedgerStep()
    with pytest.raises(ValueError, match="unknown"):
        step.add(tokens=1)
    with pytest.raises(ValueError, match=">= 0"):
        step.add(exec_seconds=-2.0)
    with pytest.raises(ValueError, match="seconds field"):
        with step.timed("gen_tokens"):
            pass


def test_timer_records_on_exception():
    timer = Timer(clock=FakeClock([1.0, 4.0]))
    with pytest.raises(RuntimeError):
        with timer:
            raise RuntimeError("boom")
    assert timer.seconds == 3.0


def test_device_seconds_are_the_busy_wall_seconds_times_the_chips():
    step = Ledger(gen_seconds=2.0, wm_seconds=1.0, train_seconds=0.5, exec_seconds=9.0)
    assert step.with_device_seconds(8).accelerator_seconds == 28.0  # execution excluded
    assert step.with_device_seconds(0).accelerator_seconds == 0.0  # a CPU host
    assert step.with_device_seconds(8).compute_seconds == step.compute_seconds


def test_tool_seconds_count_apart_from_executions():
    step = LedgerStep()
    step.add(tool_calls=3, tool_seconds=1.5, executions=1, exec_seconds=2.0, gen_seconds=0.25)
    ledger = step.ledger()
    assert (ledger.tool_calls, ledger.tool_seconds, ledger.executions) == (3.0, 1.5, 1.0)
    assert ledger.compute_seconds == 0.25 + 2.0 + 1.5
    assert Ledger.from_dict(ledger.to_dict()) == ledger
    # A ledger saved before the tool fields existed reads them as 0.
    old = {k: v for k, v in ledger.to_dict().items() if not k.startswith("tool_")}
    assert Ledger.from_dict(old).tool_seconds == 0.0
