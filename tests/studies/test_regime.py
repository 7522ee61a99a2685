"""The regime map's analysis against hand-computed compute-to-target ratios."""

import json
import math

import numpy as np
import pytest

from experiments.configs import regime as regime_config
from wmrl_jax.studies import regime, regime_report
from wmrl_jax.studies.runs import study_runs
from wmrl_jax.train.cost import CostModel

# One FLOP per second, N = 1: a forward token costs 2 s, so the token seconds are easy.
MODEL = CostModel(params=1.0, peak_flops=1.0, mfu=1.0)


def _run(curve, execs_per_step, wm_tokens_per_step=0.0, q=None):
    """One seed's summary: the exact held-out curve (start, then one value per step)."""
    steps = []
    for i, y in enumerate(curve[1:], start=1):
        s = {
            "exact/heldout_percentile": y,
            "exact/train_reward": y,
            "ledger/executions": execs_per_step * i,
            "ledger/exec_seconds": 1.5 * execs_per_step * i,
            "ledger/wm_tokens": wm_tokens_per_step * i,
            "ledger/samples": 10.0 * i,
            "ledger/cached": (10.0 - execs_per_step) * i,
        }
        if q is not None:
            s["oracle/wm_oos_group_rank_corr"] = q
        steps.append(s)
    start = {"exact/heldout_percentile": curve[0], "exact/train_reward": curve[0]}
    return {"steps": steps, "exact_start": start}


def _results():
    rise = lambda k, n: [round(0.3 + 0.3 * min(i, k) / k, 6) for i in range(n + 1)]  # noqa: E731
    return {
        # Reaches its own final level (0.6) at step 3: 30 executions.
        "real_best": [_run(rise(3, 4), 10)],
        "anchors_only": [_run(rise(6, 10), 1)],  # step 6: 6 executions
        "wmrl": [_run(rise(8, 10), 1, 5.0, q=0.3)],  # learned WM: step 8
        "wmrl_q0": [_run([0.3] * 11, 1, 5.0, q=0.0)],  # never
        "wmrl_q0.8": [_run(rise(4, 10), 1, 5.0, q=0.8)],  # step 4
    }


def _row(a, label, cost, n=1.0):
    (row,) = [r for r in a["rows"] if r["label"] == label and r["cost"] == cost
              and r["params"] == n]  # fmt: skip
    return row


def test_ratios_are_compute_to_target_under_each_cost():
    axes = regime.Axes(model=MODEL, costs=(None, 10.0), params=(1.0, 2.0))
    a = regime.analyse(_results(), arms=("wmrl",), axes=axes, smooth=1)
    assert a["target_final"] == pytest.approx(0.6)
    # Recorded seconds (1.5 per execution); WM arms pay 2·N·5 token seconds per step.
    r = _row(a, "wmrl_q0.8", None)["ratio_vs_best_real"]
    assert r["median"] == pytest.approx(45.0 / (6.0 + 40.0)) and r["reached"] == 1
    r = _row(a, "wmrl_q0.8", 10.0)["ratio_vs_best_real"]
    assert r["median"] == pytest.approx(300.0 / (40.0 + 40.0))
    r = _row(a, "wmrl_q0.8", 10.0, n=2.0)["ratio_vs_best_real"]
    assert r["median"] == pytest.approx(300.0 / (40.0 + 80.0))
    r = _row(a, "wmrl", 10.0)["ratio_vs_anchors_only"]
    assert r["median"] == pytest.approx(60.0 / (80.0 + 80.0))
    assert a["anchors_only_vs_best_real"]["10s|N1"]["median"] == pytest.approx(300.0 / 60.0)
    # A run that never reaches the target shows no saving: ratio 0, counted as never.
    never = _row(a, "wmrl_q0", 10.0)["ratio_vs_best_real"]
    assert never["median"] == 0.0 and never["run_never"] == 1 and never["reached"] == 0
    assert _row(a, "wmrl", None)["learned"]
    assert _row(a, "wmrl", None)["q_realised"] == pytest.approx(0.3)


def test_break_even_interpolates_the_median_ratio_over_realised_q():
    axes = regime.Axes(model=MODEL, costs=(None, 10.0), params=(1.0,))
    a = regime.analyse(_results(), arms=("wmrl",), axes=axes, smooth=1)
    be = {x["cost"]: x["q_break_even"] for x in a["break_even"]}
    # At 10 s: ratio 0 at q = 0 and 3.75 at q = 0.8, so 1 is crossed at 0.8 / 3.75.
    assert be[10.0] == pytest.approx(0.8 / 3.75)
    assert be[None] is None  # 45 / 46 < 1: no cell beats real_best at the recorded cost.
    assert regime.break_even([0.1, 0.5], [1.2, 2.0]) == pytest.approx(0.1)
    assert regime.break_even([], []) is None


def test_paired_difference_to_anchors_only_and_target_flatness():
    results = _results()
    results = {k: v * 3 for k, v in results.items()}  # three identical seeds
    axes = regime.Axes(model=MODEL, costs=(None,), params=(1.0,))
    a = regime.analyse(results, arms=("wmrl",), axes=axes, smooth=1)
    d = _row(a, "wmrl_q0", None)["vs_anchors_only"]
    assert d["mean"] == pytest.approx(-0.3) and d["n"] == 3
    assert a["target_flatness"]["rise_last_quarter"]["mean"] == pytest.approx(0.0)


def test_missing_target_or_control_is_refused():
    axes = regime.Axes(model=MODEL, costs=(None,), params=(1.0,))
    results = _results()
    del results["real_best"]
    with pytest.raises(ValueError, match="real_best"):
        regime.analyse(results, arms=("wmrl",), axes=axes)


def test_labels_name_their_cells():
    assert regime.parse_label("wmrl_ppi_q0.4", ("wmrl", "wmrl_ppi")) == ("wmrl_ppi", 0.4)
    assert regime.parse_label("wmrl", ("wmrl", "wmrl_ppi")) == ("wmrl", None)
    assert regime.parse_label("anchors_only", ("wmrl",)) is None


def test_config_lists_every_cell_and_needs_the_best_real_cell(tmp_path):
    config = regime_config.get_config("ppi")
    labels = [label for label, _ in study_runs(regime_report.resolve_best_real(
        _with_pick(config, tmp_path, "real_g2_lr0.003")))]  # fmt: skip
    assert labels[:3] == ["anchors_only", "wmrl", "wmrl_ppi"] and "real_best" in labels
    assert {f"wmrl_q{q:g}" for q in regime_config.Q} <= set(labels)
    assert {f"wmrl_ppi_q{q:g}" for q in regime_config.Q} <= set(labels)
    with pytest.raises(ValueError, match="make study-realsweep"):
        regime_report.resolve_best_real(_with_pick(config, tmp_path, ""))
    with pytest.raises(ValueError, match="unknown config variant"):
        regime_config.get_config("nope")


def _with_pick(config, tmp_path, pick):
    from wmrl_jax.train.config import override

    path = tmp_path / "results.json"
    path.write_text(json.dumps({"best_real": pick}))
    return override(config, **{"study.best_real_from": str(path)})


def test_render_writes_tables_figure_and_headline(tmp_path):
    config = regime_config.get_config("runlocal").to_dict()
    config["study"]["regime_costs"], config["study"]["regime_params"] = (0.0, 10.0), (1.0,)
    axes = regime.Axes(model=MODEL, costs=(None, 10.0), params=(1.0,))
    a = regime.analyse(_results(), arms=("wmrl",), axes=axes, smooth=1)
    (tmp_path / "out").mkdir()
    payload = {"config": config, "wall_seconds": 60.0, "runs": {}, "analysis": a}
    (tmp_path / "out" / "results.json").write_text(json.dumps(payload))
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "<!-- regime-headline:begin -->\n<!-- regime-headline:end -->"
    )
    (tmp_path / "docs" / "regime.md").write_text("<!-- regime:begin -->\n<!-- regime:end -->")
    regime_report.render(str(tmp_path / "out"), str(tmp_path / "README.md"))
    head = (tmp_path / "README.md").read_text()
    # The README gets the brief: the break-even table, a line per arm, a link to the rest.
    assert (
        "| wmrl | 1e-09B | — / — | 0.21 / — |" in head and "learned world model (q = 0.30)" in head
    )
    assert "every cell in [docs/regime.md](docs/regime.md)" in head
    page = (tmp_path / "docs" / "regime.md").read_text()
    assert "from q = 0.21 at" in page and "never at recorded s" in page
    assert "learned world model realises q = 0.30" in page
    assert "| wmrl_q0.8 | 0.8 | 0.80 |" in page and (tmp_path / "docs" / "regime.png").exists()
    assert not math.isnan(np.float64(a["control_final"]))


def test_ledger_totals_and_the_repeats_sentence():
    axes = regime.Axes(model=MODEL, costs=(None,), params=(1.0,))
    a = regime.analyse(_results(), arms=("wmrl",), axes=axes, smooth=1)
    # real_best: 4 steps of 10 samples, 10 executed; anchors_only: 10 steps, 1 executed.
    assert a["ledger"]["real_best"] == {"samples": 40.0, "executions": 40.0, "cached": 0.0}
    assert a["ledger"]["anchors_only"] == {"samples": 100.0, "executions": 10.0, "cached": 90.0}
    text = " ".join(regime_report.headline(a))
    assert "`anchors_only` executed 10 programs per seed and answered 90% of its 100" in text
    assert "`wmrl` executed 10." in text


def test_pairwise_accuracy_to_spearman_against_a_gaussian_sample():
    from scipy import stats

    got = regime.spearman_from_pairwise_accuracy(0.615)
    assert got["kendall_tau"] == pytest.approx(0.23)
    # Independent: a bivariate normal at the implied Pearson r, ranked by scipy.
    rng = np.random.default_rng(0)
    r = got["pearson"]
    x = rng.normal(size=(200_000, 2))
    y = r * x[:, 0] + np.sqrt(1 - r**2) * x[:, 1]
    assert stats.kendalltau(x[:, 0], y)[0] == pytest.approx(0.23, abs=0.005)
    assert stats.spearmanr(x[:, 0], y)[0] == pytest.approx(got["spearman"], abs=0.005)
    assert got["spearman"] == pytest.approx(0.34, abs=0.005)
    with pytest.raises(ValueError, match="pairwise accuracy"):
        regime.spearman_from_pairwise_accuracy(1.2)


def test_the_literature_point_is_placed_against_the_break_even():
    axes = regime.Axes(model=MODEL, costs=(None,), params=(1.0,))
    a = regime.analyse(_results(), arms=("wmrl",), axes=axes, smooth=1)
    (point,) = a["literature"]
    text = " ".join(regime_report.headline(a))
    assert "ForeAgent" in text and f"Spearman q = {point['spearman']:.2f}" in text


def test_the_brief_counts_verdicts_and_spans_medians():
    results = {k: v * 3 for k, v in _results().items()}  # three identical seeds
    axes = regime.Axes(model=MODEL, costs=(None, 10.0), params=(1.0,))
    a = regime.analyse(results, arms=("wmrl",), axes=axes, smooth=1)
    text = regime_report.brief(a, "**Lead.**")
    # Finals: anchors_only 0.6; wmrl (learned) 0.6; wmrl_q0 0.3; wmrl_q0.8 0.6. Identical
    # seeds: zero-width intervals, so 0.6 - 0.6 is equivalent, 0.3 - 0.6 below.
    assert "over its 3 cells: 1 below, 2 equivalent;" in text
    assert "interval above −0.02) in 2 of 3." in text
    # At q = 0.8: real_best / wmrl is 45 / 46 at the recorded seconds, 300 / 80 at 10 s.
    assert f"is {45 / 46:.2f}–{300 / 80:.2f}×" in text
    # anchors_only / real_best: 45 / 9 at recorded seconds (6 executions of 1.5 s)... 300 / 60.
    assert text.startswith("**Lead.** `real_best` / `anchors_only`, compute to the target: ")
    assert "No cell of the map beats" not in text  # q = 0.8 beats it at 10 s


def test_span_says_never_and_lower_bounds():
    cell = {"seeds": 4, "reached": 4, "run_never": 0, "other_never": 0}
    assert regime_report._span([{**cell, "median": 1.5}, {**cell, "median": 0.5}]) == ("0.50–1.50×")
    never = {**cell, "median": 0.0, "run_never": 3}
    bound = {**cell, "median": 2.0, "other_never": 4}
    assert regime_report._span([never, bound]) == (
        "2.00× (never in 1 of 2 cells, lower bounds in 1)"
    )
    assert regime_report._span([never]) == "never"


def test_the_map_priced_with_every_repeat_charged():
    axes = regime.Axes(model=MODEL, costs=(None, 10.0), params=(1.0,))
    a = regime.analyse(_results(), arms=("wmrl",), axes=axes, smooth=1)
    again = a["repeats_charged"]
    assert again["costs"] == [10.0]  # a cached repeat has no recorded seconds
    # Every sample is now an execution (10 per step): real_best reaches the target at
    # step 3 (300 s), anchors_only at step 6 (600 s); wmrl_q0.8 at step 4, plus its
    # 2·5 token seconds per step (400 + 40 s).
    assert again["anchors_only_vs_best_real"]["10s|N1"]["median"] == pytest.approx(0.5)
    (row,) = [r for r in again["rows"] if r["label"] == "wmrl_q0.8"]
    assert row["ratio_vs_best_real"]["median"] == pytest.approx(300.0 / 440.0)
    assert row["ratio_vs_anchors_only"]["median"] == pytest.approx(600.0 / 440.0)
    # Without repeats (the ledger's cached 0) both pricings agree.
    (own,) = [r for r in a["rows"] if r["label"] == "wmrl_q0.8" and r["cost"] == 10.0]
    assert own["ratio_vs_best_real"]["median"] == pytest.approx(300.0 / 80.0)
    page = regime_report.tables(a)
    assert "**Were every repeat executed again**" in page and "| wmrl | 1e-09B | — / 0" in page
    assert "**Were every repeat executed again**" in regime_report.brief(a, "x")
    with pytest.raises(ValueError, match="charge_repeats"):
        CostModel(params=1.0, peak_flops=1.0, mfu=1.0, charge_repeats=True)
