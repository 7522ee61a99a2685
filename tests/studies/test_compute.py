"""The compute study's analysis on hand-made curves whose ratios are known exactly."""

import numpy as np
import pytest

from wmrl_jax.studies import compute as study
from wmrl_jax.studies import report


def _run(compute, heldout, train_compute, train_reward):
    """One seed's summary: eval points (history) and per-step metrics (steps)."""
    history = [
        {
            "step": i,
            "gen_seconds": 0.0,
            "wm_seconds": 0.0,
            "exec_seconds": float(c),
            "executions": float(i),
            "eval/heldout_percentile": float(p),
        }
        for i, (c, p) in enumerate(zip(compute, heldout, strict=True))
    ]
    steps = [
        {"ledger/compute_seconds": float(c), "oracle/true_reward": float(r)}
        for c, r in zip(train_compute, train_reward, strict=True)
    ]
    return {"history": history, "steps": steps}


def _study(seeds=3):
    points = np.linspace(0.0, 1.0, 11)
    real_c, cheap_c = 100.0 * points, 10.0 * points
    steps = np.linspace(0.1, 1.0, 10)
    return {
        # real: 0.4 -> 0.6 over 100 s; train reward 0.4 -> 0.8 over 100 s.
        "real": [
            _run(real_c, 0.4 + 0.2 * points, 100 * steps, 0.4 + 0.4 * steps) for _ in range(seeds)
        ],
        # Same curves ten times cheaper: every ratio is 10.
        "cheap": [
            _run(cheap_c, 0.4 + 0.2 * points, 10 * steps, 0.4 + 0.4 * steps) for _ in range(seeds)
        ],
        # Ends above real's best on held-out (real never matches it) and reaches
        # 0.6 (real's final) at 5 s; its train reward plateaus at 0.6.
        "better": [
            _run(cheap_c, 0.4 + 0.4 * points, 10 * steps, np.minimum(0.6, 0.3 + steps))
            for _ in range(seeds)
        ],
        # Gets worse: no level to match.
        "worse": [
            _run(cheap_c, 0.4 - 0.1 * points, 10 * steps, 0.4 - 0.1 * steps) for _ in range(seeds)
        ],
    }


def test_headline_and_matched_ratios():
    a = study.analyse(_study(), smooth=1)
    assert a["real"]["ratio_median"] == pytest.approx(1.0)
    assert a["real"]["matched_ratio_median"] == pytest.approx(1.0)
    assert a["cheap"]["ratio_median"] == pytest.approx(10.0)
    assert a["cheap"]["matched_ratio_median"] == pytest.approx(10.0)
    assert a["cheap"]["matched_never"] == 0
    assert a["cheap"]["train_ratio_median"] == pytest.approx(10.0)
    assert a["cheap"]["train_matched_ratio_median"] == pytest.approx(10.0)
    # real's final 0.6 is reached at 5 s: 100 / 5.
    assert a["better"]["ratio_median"] == pytest.approx(20.0)
    # real never reaches 0.8: censored at its whole budget over the run's 10 s.
    assert a["better"]["matched_ratio_median"] == pytest.approx(10.0)
    assert (a["better"]["matched_never"], a["better"]["matched_seeds"]) == (3, 3)
    assert a["better"]["matched_censored"] == [True] * 3
    # Train rewards are smoothed over 5 steps: the run's plateau 0.6 (from its
    # 3rd step) shows from its 7th step (7 s); real's ramp 0.44, 0.48, ... averages
    # 0.6 over its steps 3-7 (70 s). It never reaches real's final.
    assert a["better"]["train_matched_ratio_median"] == pytest.approx(10.0)
    assert a["better"]["train_matched_never"] == 0
    assert a["better"]["train_reached"] == 0
    assert a["worse"]["matched_ratio_median"] is None
    assert a["worse"]["train_matched_ratio_median"] is None
    assert a["real"]["heldout_target_above_start"] is True


def test_matched_cell_marks_lower_bounds():
    a = study.analyse(_study(), smooth=1)
    assert report.matched_cell(a["cheap"]) == "10.00× [10.00, 10.00] (0/3 never)"
    assert report.matched_cell(a["better"]) == "≥ 10.00× [10.00, 10.00] (3/3 never)"
    assert report.matched_cell(a["worse"]) == "—"
    table = report.format_study_table(a)
    assert table.count("\n") == 1 + len(a)
    assert all(line.count("|") == 12 for line in table.splitlines())


def test_ratio_against_the_control_arm():
    a = study.analyse(_study(), smooth=1, control="cheap")
    # Both reach real's final 0.6: cheap at 10 s, better at 5 s.
    assert a["better"]["ratio_vs_control_median"] == pytest.approx(2.0)
    assert a["cheap"]["ratio_vs_control_median"] == pytest.approx(1.0)
    assert a["real"]["ratio_vs_control_median"] == pytest.approx(0.1)
    assert a["worse"]["ratio_vs_control_median"] is None and a["worse"]["control_reached"] == 3


def test_runs_of_different_lengths_end_at_their_last_point():
    results = _study(seeds=2)
    short = results["cheap"][1]  # A budget-limited run that stopped at its 6th eval point.
    short["history"], short["steps"] = short["history"][:6], short["steps"][:6]
    a = study.analyse(results, smooth=1)
    assert a["cheap"]["heldout_final"] == pytest.approx((0.6 + 0.5) / 2)
    assert a["cheap"]["compute_total"] == pytest.approx((10.0 + 5.0) / 2)
    assert a["cheap"]["updates"] == pytest.approx((10 + 5) / 2)
    assert a["cheap"]["reached"] == 1  # the short seed never reaches 0.6


def test_modelled_compute_charges_rows_at_llm_lengths():
    from wmrl_jax.train.cost import CostModel, TokenLengths

    results = _study(seeds=1)
    for runs in results.values():  # 100 samples and 10 trained rows per eval interval
        for i, h in enumerate(runs[0]["history"]):
            h.update(samples=100.0 * i, wm_rows=0.0, train_rows=10.0 * i)
        for i, s in enumerate(runs[0]["steps"], 1):
            s.update({"ledger/samples": 100.0 * i, "ledger/train_rows": 10.0 * i,
                      "ledger/exec_seconds": s["ledger/compute_seconds"]})  # fmt: skip
    cost = CostModel(1e9, 1e12, 0.5, TokenLengths(sample=1000, wm_row=1, train_row=1000))
    a = study.analyse(results, smooth=1, cost=cost)
    # Tokens: (2e9 * 1e5 + 6e9 * 1e4) / 5e11 = 520 s per interval on top of execution, the
    # same for every run: cheap's 10x saving shrinks to (100 + 5200) / (10 + 5200).
    assert a["cheap"]["ratio_median"] == pytest.approx(5300 / 5210)
    assert a["real"]["compute_total"] == pytest.approx(100 + 5200)
