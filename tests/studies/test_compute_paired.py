"""The compute study's exact, paired analysis on hand-made curves (values by hand, float64)."""

import math

import numpy as np
import pytest
from scipy import stats

from wmrl_jax.studies import compute_paired as paired

OFFSET = np.array([0.0, 0.01, -0.01])  # Per seed, on every arm: paired designs cancel it.
NOISE = np.array([0.01, -0.01, 0.03])  # Per seed, on the fast arm's gain only.


def _run(compute, start, gain, seed):
    """One seed: exact values linear in the step, from `start` to `start + gain` over 10."""
    k = np.arange(1, 11)
    y = start + OFFSET[seed] + gain * k / 10
    return {
        "exact_start": {
            "exact/heldout_percentile": start + OFFSET[seed], "exact/train_reward": 0.3,
        },
        "steps": [
            {"ledger/compute_seconds": float(c), "exact/heldout_percentile": float(v),
             "exact/train_reward": 0.3 + 0.01 * i}
            for i, (c, v) in enumerate(zip(compute * k, y, strict=True))
        ],
    }  # fmt: skip


def _results():
    return {
        "real": [_run(10.0, 0.4, 0.2, s) for s in range(3)],
        "anchors_only": [_run(10.0, 0.4, 0.2, s) for s in range(3)],
        "fast": [_run(1.0, 0.4, 0.4 + NOISE[s], s) for s in range(3)],
        "slow": [_run(1.0, 0.4, 0.1, s) for s in range(3)],
    }


def test_exact_analysis_by_hand():
    out = paired.analyse_exact(_results(), margin=0.02, smooth=1)
    rows = out["rows"]
    assert out["margin"] == 0.02 and out["level"] == 0.9
    real, fast, slow = rows["real"], rows["fast"], rows["slow"]
    assert real["heldout_start"] == pytest.approx(0.4)
    assert real["heldout_final"] == pytest.approx(0.6)
    assert real["train_start"] == pytest.approx(0.3) and real["train_final"] == pytest.approx(0.39)
    # real reaches its own final at its last step (100 s): ratio 1.
    assert real["ratio_median"] == pytest.approx(1.0) and real["ratio_seeds"] == 3
    # fast gains 0.2 (real's gain) at step 10 * 0.2 / (0.4 + e), 1 s per step.
    to_target = 10 * 0.2 / (0.4 + NOISE)
    np.testing.assert_allclose(fast["to_target"], to_target, atol=1e-9)
    assert fast["ratio"] == pytest.approx((100.0 / to_target).tolist())
    assert fast["ratio_median"] == pytest.approx(float(np.median(100.0 / to_target)))
    # slow ends below the target on every seed: never, no ratio.
    assert slow["to_target"] == [None] * 3 and slow["reached"] == 0
    assert slow["ratio_median"] is None
    # Paired difference of the final levels: fast − real = 0.2 + e per seed.
    d = 0.2 + NOISE
    se = d.std(ddof=1) / math.sqrt(3)
    half = stats.t.ppf(0.95, 2) * se
    diff = fast["vs_real"]
    assert diff["n"] == 3 and diff["mean"] == pytest.approx(d.mean())
    assert (diff["lo"], diff["hi"]) == pytest.approx((d.mean() - half, d.mean() + half))
    assert diff["verdict"] == ("above" if d.mean() - half > 0 else "inconclusive")
    assert fast["vs_anchors_only"] == diff
    # real against its copy: identical per seed, an interval of width 0 inside the margin.
    assert rows["anchors_only"]["vs_real"]["verdict"] == "equivalent"
    assert "vs_real" not in real and real["vs_anchors_only"]["mean"] == pytest.approx(0.0)
    assert paired.best_real({"rows": {"real": real, "real_g1_lr0.003": fast, "fast": fast}}) == (
        "real_g1_lr0.003"
    )
    table = paired.format_exact_table(out)
    assert "| fast | 0.400 → " in table and "never (0/3 reach it)" in table
    assert any("`fast`" not in line for line in paired.exact_lines(out))


def test_has_exact_needs_every_run():
    results = _results()
    assert paired.has_exact(results)
    del results["slow"][1]["exact_start"]
    assert not paired.has_exact(results)
    with pytest.raises(ValueError, match="no run labelled"):
        paired.best_real({"rows": {"wmrl": {}}})


def test_headline_comparison_pairs_the_seeds():
    from wmrl_jax.studies import compute_report

    a = np.array([0.50, 0.60, 0.70, 0.55, 0.65])
    b = a - 0.02 + np.array([0.001, -0.001, 0.0, 0.002, -0.002])

    def row(x):
        se = x.std(ddof=1) / math.sqrt(len(x))
        return {"heldout_final": x.mean(), "heldout_final_se": se}

    # Unpaired, the seeds' spread hides the difference: within two standard errors.
    assert compute_report._compare(row(a), row(b), False)[2] == "level with"
    # Paired, it is clear: the 90% t interval of the per-seed differences excludes 0.
    rows = [{**row(x), "heldout_final_seeds": x.tolist()} for x in (a, b)]
    diff, se, side = compute_report._compare(*rows, False)
    d = a - b
    assert side == "above" and diff == pytest.approx(d.mean())
    assert se == pytest.approx(d.std(ddof=1) / math.sqrt(5))
    assert compute_report._compare(*rows, True)[2] == "(one seed) beside"
