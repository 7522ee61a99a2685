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
    assert diff["against"] == "real" and fast["vs_anchors_only"]["against"] == "anchors_only"
    assert {**fast["vs_anchors_only"], "against": "real"} == diff
    # real against its copy: identical per seed, an interval of width 0 inside the margin.
    assert rows["anchors_only"]["vs_real"]["verdict"] == "equivalent"
    assert "vs_real" not in real and real["vs_anchors_only"]["mean"] == pytest.approx(0.0)
    assert paired.best_real({"rows": {"real": real, "real_g1_lr0.003": fast, "fast": fast}}) == (
        "real_g1_lr0.003"
    )
    table = paired.format_exact_table(out)
    assert "| fast | 0.400 → " in table and "never (0/3 reach it)" in table
    assert any("`fast`" not in line for line in paired.exact_lines(out))


def test_a_variant_is_compared_with_the_controls_run_of_the_same_variant():
    # `fast_warm` and `anchors_only_warm` share a change that moves every arm's start
    # (a longer warm start): the variant's paired difference is against that control.
    results = {
        **_results(),
        "fast_warm": [_run(1.0, 0.5, 0.4, s) for s in range(3)],
        "anchors_only_warm": [_run(10.0, 0.5, 0.3, s) for s in range(3)],
    }
    assert paired.matched("fast_warm", "anchors_only", results) == "anchors_only_warm"
    assert paired.matched("fast_warm", "real", results) == "real"  # No `real_warm`.
    assert paired.matched("anchors_only_warm", "anchors_only", results) == "anchors_only"
    assert paired.matched("anchors_only", "anchors_only", results) == "anchors_only"
    out = paired.analyse_exact(results, margin=0.02, smooth=1)
    rows = out["rows"]
    d = rows["fast_warm"]["vs_anchors_only"]
    assert d["against"] == "anchors_only_warm"
    assert d["mean"] == pytest.approx(0.1)  # 0.5 + 0.4 against 0.5 + 0.3, every seed.
    assert rows["fast_warm"]["vs_real"]["against"] == "real"
    assert rows["fast_warm"]["vs_real"]["mean"] == pytest.approx(0.3)
    # Compute to the target: `fast_warm` against `real` (no `real_warm`), 0.6 per seed.
    assert rows["fast_warm"]["target"] == "real"
    np.testing.assert_allclose(rows["fast_warm"]["to_target"], 10 * 0.1 / 0.4 * np.ones(3))
    assert rows["real"]["target"] == "real"
    # With `real_warm`, to its final level (0.7 per seed: step 5 of `fast_warm`, its 5 s
    # against `real_warm`'s 100 s).
    results["real_warm"] = [_run(10.0, 0.5, 0.2, s) for s in range(3)]
    warm = paired.analyse_exact(results, margin=0.02, smooth=1)["rows"]["fast_warm"]
    assert warm["target"] == "real_warm" and warm["vs_real"]["against"] == "real_warm"
    np.testing.assert_allclose(warm["to_target"], 5.0)
    assert warm["ratio_median"] == pytest.approx(20.0)
    # The control's own variant is compared with the plain control.
    assert rows["anchors_only_warm"]["vs_anchors_only"]["mean"] == pytest.approx(0.2)
    line = next(
        x for x in paired.format_exact_table(out).splitlines() if x.startswith("| fast_warm |")
    )
    assert line.endswith("against `anchors_only_warm`) |")
    exact = paired.analyse_exact(
        {"wmrl": results["fast"], "wmrl_warm": results["fast_warm"],
         **{k: results[k] for k in ("real", "anchors_only", "anchors_only_warm")}},
        margin=0.02, smooth=1,
    )  # fmt: skip
    assert any(x.startswith("`wmrl_warm` − `anchors_only_warm`: +0.100")
               for x in paired.exact_lines(exact))  # fmt: skip


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


def test_the_headline_compares_a_variant_with_its_own_control():
    """`compute_report._variant_lines`: `wmrl_warm` against `anchors_only_warm` (the same
    change to every arm's start), `wmrl_pv` against the plain `anchors_only`."""
    from wmrl_jax.studies import compute_report

    def row(finals, corr=None):
        return {"heldout_final_seeds": finals, "wm_rank_corr": corr}

    lines = compute_report._variant_lines(
        {"wmrl": row([0.5, 0.6, 0.7], 0.1), "anchors_only": row([0.5, 0.6, 0.7]),
         "wmrl_warm": row([0.8, 0.9, 1.0], 0.2), "anchors_only_warm": row([0.8, 0.9, 1.0]),
         "wmrl_pv": row([0.6, 0.7, 0.8], 0.3)},
        few=False,
    )  # fmt: skip
    warm, pv = (next(x for x in lines if x.startswith(f"`{k}`")) for k in ("wmrl_warm", "wmrl_pv"))
    assert "above `wmrl` (+0.300" in warm and "level with `anchors_only_warm` (+0.000" in warm
    assert pv.endswith("above `anchors_only` (+0.100 ± 0.000).")
