"""The studies' one analysis against values computed by hand (numpy float64)."""

import math

import numpy as np
import pytest
from scipy import stats

from wmrl_jax.studies import analysis


def test_reach_interpolates_between_points():
    x = np.array([0.0, 100.0, 200.0])
    # 0.25 lies a quarter of the way from 0.0 to 1.0 ... between points 0 and 1: x = 50.
    assert analysis.reach(x, [0.0, 0.5, 1.0], 0.25) == 50.0
    # Between 0.2 (x=100) and 0.6 (x=200): (0.4 - 0.2) / 0.4 = half way.
    assert analysis.reach(x, [0.0, 0.2, 0.6], 0.4) == pytest.approx(150.0, abs=1e-12)
    assert analysis.reach(x, [0.3, 0.5, 1.0], 0.25) == 0.0  # Starts above it.
    assert analysis.reach(x, [0.0, 0.25, 1.0], 0.25) == 100.0  # Exactly on a point.
    assert math.isinf(analysis.reach(x, [0.0, 0.1, 0.2], 0.25))  # Never.
    # The first crossing counts, even where the curve falls back later.
    assert analysis.reach(x, [0.0, 0.5, 0.2], 0.25) == 50.0
    assert analysis.reach(x, [0.5, 0.0, 1.0], 0.25) == 0.0


def test_reach_leaves_out_points_after_a_runs_end_and_flat_x():
    # A run that stopped after two points: NaN afterwards is not part of the curve.
    assert math.isinf(analysis.reach([0.0, 10.0, np.nan], [0.0, 0.1, np.nan], 0.2))
    assert analysis.reach([0.0, 10.0, np.nan], [0.0, 0.4, np.nan], 0.2) == 5.0
    assert math.isinf(analysis.reach([np.nan], [np.nan], 0.0))
    # Executions that do not grow (an arm without executions): reached at 0.
    assert analysis.reach([0.0, 0.0, 0.0], [0.1, 0.3, 0.5], 0.4) == 0.0
    with pytest.raises(ValueError, match="must be"):
        analysis.reach([0.0, 1.0], [0.0], 0.5)


def test_reach_rows_per_seed_targets():
    x = np.array([[0.0, 10.0, 20.0], [0.0, 20.0, 40.0]])
    y = np.array([[0.0, 0.5, 1.0], [0.0, 0.5, 1.0]])
    out = analysis.reach_rows(x, y, np.array([0.25, 0.75]))
    np.testing.assert_allclose(out, [5.0, 30.0])
    assert analysis.reach_rows(x, y, 2.0).tolist() == [math.inf, math.inf]


def test_paired_difference_by_hand():
    a = np.array([0.50, 0.62, 0.71, 0.55, np.nan])
    b = np.array([0.45, 0.60, 0.60, 0.58, 0.40])
    p = analysis.paired(a, b, level=0.9)
    d = np.array([0.05, 0.02, 0.11, -0.03])  # The NaN pair is left out.
    assert p.n == 4
    np.testing.assert_allclose(p.diffs, d, atol=1e-12)
    mean = d.sum() / 4
    sd = math.sqrt(((d - mean) ** 2).sum() / 3)
    se = sd / 2.0
    t95 = 2.353363434801823  # Student t, 3 degrees of freedom, 95th percentile (tables).
    assert p.mean == pytest.approx(mean, abs=1e-12)
    assert p.se == pytest.approx(se, abs=1e-12)
    assert p.lo == pytest.approx(mean - t95 * se, abs=1e-9)
    assert p.hi == pytest.approx(mean + t95 * se, abs=1e-9)
    assert stats.t.ppf(0.95, 3) == pytest.approx(t95, abs=1e-12)
    row = p.to_dict()
    assert row["n"] == 4 and row["level"] == 0.9 and len(row["diffs"]) == 4


def test_paired_with_fewer_than_two_pairs_has_no_interval():
    p = analysis.paired([0.5, np.nan], [0.4, 0.3])
    assert p.n == 1 and p.mean == pytest.approx(0.1) and math.isnan(p.lo)
    assert p.to_dict()["lo"] is None
    assert analysis.equivalence(p, 0.02) == "no pairs"
    with pytest.raises(ValueError, match="one shape"):
        analysis.paired([0.5], [0.4, 0.3])
    with pytest.raises(ValueError, match="level"):
        analysis.paired([0.5, 0.6], [0.4, 0.3], level=90)


@pytest.mark.parametrize(
    "diffs, verdict",
    [
        ([0.001, -0.002, 0.003, 0.0, 0.001, -0.001], "equivalent"),  # Inside ±0.02.
        ([0.10, 0.12, 0.09, 0.11], "above"),
        ([-0.10, -0.12, -0.09, -0.11], "below"),
        ([0.05, -0.06, 0.04, -0.05], "inconclusive"),  # Wide, across 0 and the margin.
    ],
)
def test_equivalence_verdicts(diffs, verdict):
    p = analysis.paired(np.asarray(diffs), np.zeros(len(diffs)))
    assert analysis.equivalence(p, 0.02) == verdict
    with pytest.raises(ValueError, match="margin"):
        analysis.equivalence(p, 0.0)
