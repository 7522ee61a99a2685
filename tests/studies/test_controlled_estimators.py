"""The controlled study's estimator table: each estimator against `anchors_only`, by hand."""

import math

import numpy as np
import pytest
from scipy import stats

from wmrl_jax.studies import controlled_report


def _row(finals, *, r=0.6, lam=0.5, error=0.2, late=(0.01, 0.002)):
    finals = list(finals)
    return {
        "final_true_reward": float(np.mean(finals)), "final_true_reward_seeds": finals,
        "late_gain": late[0], "late_gain_se": late[1], "wm_correlation_last_quarter": r,
        "reliability_last_quarter": lam, "gradient_error": error,
    }  # fmt: skip


CONTROL = [0.80, 0.82, 0.81, 0.79]


def test_paired_difference_verdict_and_ppi_prediction_by_hand():
    ppi_finals = [0.81, 0.83, 0.80, 0.80]  # differences +0.01, +0.01, -0.01, +0.01
    sweep = {
        0.15: {
            "anchors_only": _row(CONTROL, error=0.4),
            "wmrl_ppi": _row(ppi_finals, r=0.6, error=0.3),
            "wmrl": _row([0.70, 0.71, 0.69, 0.70], r=float("nan"), error=0.9),
        }
    }
    rows = controlled_report.against_control(sweep, margin=0.05, anchors=2, groups=20)
    assert [r["arm"] for r in rows] == ["wmrl", "wmrl_ppi"]  # the table's order
    ppi = rows[1]
    d = np.array([0.01, 0.01, -0.01, 0.01])
    se = d.std(ddof=1) / 2
    half = stats.t.ppf(0.95, 3) * se
    assert ppi["paired"]["mean"] == pytest.approx(0.005)
    assert ppi["paired"]["lo"] == pytest.approx(0.005 - half)
    assert ppi["paired"]["hi"] == pytest.approx(0.005 + half)
    assert ppi["verdict"] == "equivalent" and ppi["not_below"]
    # n_eff = 1 / ((1 - r^2)/n + r^2/B) at r = 0.6, n = 2, B = 20; best-λ ratio 1 - r^2.
    assert ppi["n_eff"] == pytest.approx(1 / (0.64 / 2 + 0.36 / 20), rel=1e-6)
    assert ppi["predicted_error_ratio"] == pytest.approx(0.64)
    assert ppi["error_ratio"] == pytest.approx(0.75)
    # wmrl is far below its control, and has no correlation to predict from.
    low = rows[0]
    assert low["verdict"] == "below" and not low["not_below"]
    assert low["r"] is None and low["n_eff"] is None
    table = controlled_report.format_against_control(rows, margin=0.05, anchors=2, groups=20)
    assert "| 15% | wmrl_ppi | +0.005 [" in table and "| equivalent | yes |" in table
    assert "| 0.64 / 0.75 |" in table and "n_eff of n = 2 (B = 20)" in table


def test_not_below_needs_the_interval_above_minus_margin():
    # Mean -0.01 with a wide interval: inconclusive, and not shown to be not below at 0.02.
    finals = [c + d for c, d in zip(CONTROL, (0.03, -0.05, 0.02, -0.04), strict=True)]
    sweep = {0.3: {"anchors_only": _row(CONTROL), "wmrl_ppi": _row(finals)}}
    (row,) = controlled_report.against_control(sweep, margin=0.02, anchors=2, groups=20)
    assert row["paired"]["mean"] == pytest.approx(-0.01)
    assert row["verdict"] == "inconclusive" and not row["not_below"]
    # At a margin wider than the interval's lower end, it is.
    (row,) = controlled_report.against_control(sweep, margin=0.2, anchors=2, groups=20)
    assert row["not_below"] and math.isfinite(row["paired"]["lo"])


def test_headline_says_where_ppi_kept_to_its_control():
    sweep = {
        0.0: {"anchors_only": _row(CONTROL), "wmrl_ppi": _row([0.81, 0.83, 0.80, 0.80])},
        0.15: {
            "anchors_only": _row(CONTROL),
            "wmrl_ppi": _row([0.76, 0.75, 0.77, 0.74], late=(0.02, 0.004)),
            "wmrl": _row([0.82, 0.84, 0.80, 0.80], late=(0.001, 0.003)),
        },
    }
    rows = controlled_report.against_control(sweep, margin=0.02, anchors=2, groups=20)
    summary = {
        "real": {"final_true_reward": 0.9, "final_true_reward_se": 0.01, "total_executions": 10},
        "wmrl": {"final_true_reward": 0.8, "final_true_reward_se": 0.01, "total_executions": 1},
    }
    text = controlled_report.headline(
        summary, [0.0, 0.15], fraction=0.15, seeds=4, steps=40, estimators=rows, margin=0.02
    )
    assert (
        "`wmrl_ppi` against `anchors_only` (paired over seeds, margin 0.02): +0.005 at 0%, "
        "-0.050 at 15%; not below it by more than the margin at 0%, not shown at 15%."
    ) in text
    assert (
        "At 15% its last quarter gains +0.020 ± 0.004 over the quarter before, `wmrl`'s "
        "+0.001 ± 0.003." in text
    )
    # Without the rows the headline is the one before the estimators.
    assert "wmrl_ppi" not in controlled_report.headline(
        summary, [0.0], fraction=0.15, seeds=4, steps=40
    )
