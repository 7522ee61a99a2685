"""The world-model probe: its metrics against independent references, the regime read-out on
a hand-made map, and whole runs (recipe agent replayed, text agent executed locally)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats
from sklearn.isotonic import IsotonicRegression
from sklearn.metrics import roc_auc_score

from experiments.configs import wm_probe as probe_config
from wmrl_jax.envs.outcomes import Outcome
from wmrl_jax.studies import regime, regime_readout, wm_metrics, wm_probe
from wmrl_jax.train.config import ConfigError, override

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TUNED = os.path.join("tests", "agents", "fixtures", "qwen3_text_tuned")


def _groups(seed=0, g=9, k=6):
    """Predictions and real rewards [g, k] with ties, NaNs and degenerate groups."""
    rng = np.random.default_rng(seed)
    real = rng.integers(0, 5, size=(g, k)) / 4.0  # ties within groups
    pred = real + rng.normal(scale=0.4, size=(g, k))
    pred[0] = 0.3  # constant prediction
    real[1] = 0.5  # constant real reward
    pred[2, :4] = np.nan  # two programs left
    pred[3, 1] = pred[3, 2]  # a tie in the prediction
    real[4, 0] = np.nan
    return pred, real


# -- metrics against references -------------------------------------------------------------


def test_group_spearman_matches_scipy_and_counts_what_it_leaves_out():
    pred, real = _groups()
    got = wm_metrics.group_spearman(pred, real)
    rhos = []
    for p, r in zip(pred, real, strict=True):
        ok = np.isfinite(p) & np.isfinite(r)
        if ok.sum() >= 3 and np.ptp(p[ok]) > 0 and np.ptp(r[ok]) > 0:
            rhos.append(stats.spearmanr(p[ok], r[ok]).statistic)
    assert got["groups"] == len(rhos) == 6 and got["of"] == 9
    assert (got["too_few"], got["constant_real"], got["constant_pred"]) == (1, 1, 1)
    assert got["mean"] == pytest.approx(np.mean(rhos), abs=1e-6)
    assert got["se"] == pytest.approx(np.std(rhos, ddof=1) / np.sqrt(6), abs=1e-6)
    empty = wm_metrics.group_spearman(np.ones((2, 3)), real[:2, :3])
    assert empty["mean"] is None and empty["se"] is None and empty["groups"] == 0


def test_pairwise_accuracy_matches_a_brute_force_count():
    pred, real = _groups(1)
    score = pairs = tied = 0
    for p, r in zip(pred, real, strict=True):
        for i, j in itertools.combinations(range(len(p)), 2):
            if not all(np.isfinite([p[i], p[j], r[i], r[j]])):
                continue
            if r[i] == r[j]:
                tied += 1
                continue
            pairs += 1
            score += 0.5 if p[i] == p[j] else float((p[i] - p[j]) * (r[i] - r[j]) > 0)
    got = wm_metrics.pairwise_accuracy(pred, real)
    assert (got["pairs"], got["tied_real"]) == (pairs, tied)
    assert got["accuracy"] == pytest.approx(score / pairs, abs=1e-12)
    assert wm_metrics.pairwise_accuracy(np.ones((1, 3)), np.ones((1, 3)))["accuracy"] is None
    # Reversed predictions score one minus (ties in the prediction stay at 1/2).
    flipped = wm_metrics.pairwise_accuracy(-pred, real)["accuracy"]
    assert flipped == pytest.approx(1 - got["accuracy"], abs=1e-12)


def test_failure_auc_matches_sklearn_and_names_the_one_class_cases():
    rng = np.random.default_rng(2)
    pred = np.round(rng.normal(size=(6, 5)), 1)  # ties
    failed = rng.random((6, 5)) < 0.3
    pred[0, 0] = np.nan
    ok = np.isfinite(pred)
    got = wm_metrics.failure_auc(pred, failed)
    assert got["auc"] == pytest.approx(roc_auc_score(failed[ok], -pred[ok]), abs=1e-12)
    assert got["programs"] == ok.sum() and got["failures"] == failed[ok].sum()
    none = wm_metrics.failure_auc(pred, np.zeros_like(failed))
    assert none["auc"] is None and none["note"] == "no failures observed"
    every = wm_metrics.failure_auc(pred, np.ones_like(failed))
    assert every["auc"] is None and every["note"] == "every program failed"
    with pytest.raises(ValueError, match="shape"):
        wm_metrics.failure_auc(pred, failed[:2])


def test_calibration_error_by_hand():
    # Two bins split at the median 0.25: {0.1, 0.2} and {0.3, 0.4}.
    pred, real = np.array([0.1, 0.2, 0.3, 0.4]), np.array([0.0, 0.4, 0.2, 0.6])
    got = wm_metrics.calibration_error(pred, real, bins=2)
    assert got["ece"] == pytest.approx(0.5 * 0.05 + 0.5 * 0.05, abs=1e-12)
    # Equal predictions share a bin: the median 0.2 is the edge and the three 0.2s go above
    # it with 0.9, {0.1} | {0.2, 0.2, 0.2, 0.9}: (1/5)|0.1 - 0| + (4/5)|0.375 - 0.35|.
    pred, real = np.array([0.1, 0.2, 0.2, 0.2, 0.9]), np.array([0.0, 0.3, 0.6, 0.0, 0.5])
    got = wm_metrics.calibration_error(pred, real, bins=2)
    assert got["ece"] == pytest.approx(0.2 * 0.1 + 0.8 * 0.025, abs=1e-12)
    assert wm_metrics.calibration_error(pred, real, bins=1)["ece"] == pytest.approx(
        abs(pred.mean() - real.mean()), abs=1e-12
    )
    assert wm_metrics.calibration_error([np.nan], [1.0], bins=3)["ece"] is None
    with pytest.raises(ValueError, match="bins"):
        wm_metrics.calibration_error(pred, real, bins=0)


def test_crossfit_isotonic_matches_sklearn_fold_by_fold_and_never_sees_its_fold():
    rng = np.random.default_rng(3)
    g, k = 10, 7
    pred = rng.permutation(g * k).reshape(g, k) / (g * k)  # distinct, exact in float32
    real = np.round(np.sqrt(pred) + rng.normal(scale=0.2, size=(g, k)), 3)
    real[0, 0] = np.nan
    fold = wm_metrics.group_folds(g, 3, seed=0)
    assert sorted(np.bincount(fold)) == [3, 3, 4]
    got = wm_metrics.crossfit_isotonic(pred, real, fold)
    assert np.isnan(got[0, 0])
    for f in range(3):
        train = (fold != f)[:, None] & np.isfinite(real)
        held = (fold == f)[:, None] & np.isfinite(real)
        ref = IsotonicRegression(out_of_bounds="clip").fit(pred[train], real[train])
        np.testing.assert_allclose(got[held], ref.predict(pred[held]), atol=1e-5)  # float32 fit
    # Cross-fitted: a fold's own real rewards do not move its calibrated predictions.
    moved = real.copy()
    moved[fold == 0] += 5.0
    again = wm_metrics.crossfit_isotonic(pred, moved, fold)
    np.testing.assert_array_equal(again[fold == 0], got[fold == 0])
    assert not np.allclose(again[fold != 0], got[fold != 0])


def test_crossfit_calibration_needs_two_groups():
    one = wm_metrics.crossfit_calibration(np.ones((1, 4)), np.ones((1, 4)), folds=5, bins=2, seed=0)
    assert one["ece"] is None and "2 groups" in one["note"]
    pred, real = _groups(4)
    got = wm_metrics.crossfit_calibration(pred, real, folds=5, bins=4, seed=0)
    assert got["folds"] == 5 and got["groups"] == 9 and got["ece"] >= 0 and got["raw_ece"] >= 0


# -- the regime read-out on a hand-made map ---------------------------------------------------

RATIOS = {  # cost -> (ratio vs real_best, vs anchors_only) at realised q 0.0, 0.4, 0.8
    None: ((0.2, 0.4, 0.8), (0.1, 0.2, 0.5)),
    30.0: ((0.5, 1.0, 2.0), (0.4, 0.8, 1.6)),
    300.0: ((0.8, 2.0, 4.0), (0.6, 1.5, 3.0)),
}
ANCHORS_ONLY = {None: 1.5, 30.0: 1.2, 300.0: 1.1}


def _map(anchors_only=ANCHORS_ONLY) -> dict:
    rows, be, n = [], [], 1e9
    for cost, (vs_best, vs_ao) in RATIOS.items():
        for q, a, b in zip((0.0, 0.4, 0.8), vs_best, vs_ao, strict=True):
            rows.append({"arm": "wmrl", "learned": False, "q": q, "q_realised": q, "cost": cost,
                         "params": n, "ratio_vs_best_real": {"median": a},
                         "ratio_vs_anchors_only": {"median": b}})  # fmt: skip
        rows.append({"arm": "wmrl", "learned": True, "q": None, "q_realised": 0.1, "cost": cost,
                     "params": n, "ratio_vs_best_real": {"median": 9.0},
                     "ratio_vs_anchors_only": {"median": 9.0}})  # fmt: skip
        be.append({"arm": "wmrl", "cost": cost, "params": n,
                   "q_break_even": regime.break_even([0.0, 0.4, 0.8], list(vs_best)),
                   "q_break_even_vs_anchors_only": regime.break_even([0.0, 0.4, 0.8],
                                                                     list(vs_ao))})  # fmt: skip
    control = {f"{regime.cost_key(c)}|N{n:g}": {"median": m} for c, m in anchors_only.items()}
    analysis = {"arms": ["wmrl"], "costs": list(RATIOS), "params": [n], "rows": rows,
                "break_even": be, "anchors_only_vs_best_real": control}  # fmt: skip
    config = {"anchor_fraction": 0.1, "group_size": 8, "study": {"best_real": "real_g2_lr0.001"}}
    return {"config": config, "analysis": analysis}


def test_readout_interpolates_the_arm_at_q_and_recommends_the_cheapest_way():
    m = _map()
    out = regime_readout.readout(m, q=0.6, seconds=100.0, params=1e9)
    assert out["cost"] == 30.0 and out["params"] == 1e9 and out["rho"] == 0.1
    arm = out["arms"]["wmrl"]
    assert arm["ratio_vs_best_real"] == pytest.approx(1.5)  # halfway between 1.0 and 2.0
    assert arm["ratio_vs_anchors_only"] == pytest.approx(1.2)
    assert arm["q_break_even"] == pytest.approx(0.4) and arm["note"] == ""
    assert arm["q_break_even_vs_anchors_only"] == pytest.approx(0.5)
    rec = out["recommendation"]
    assert (rec["arm"], rec["rho"], rec["ratio"]) == ("wmrl", 0.1, pytest.approx(1.5))
    # Below the break-even the control is cheaper than real GRPO and the world model.
    rec = regime_readout.readout(m, q=0.2, seconds=100.0, params=1e9)["recommendation"]
    assert (rec["arm"], rec["rho"], rec["ratio"]) == ("anchors_only", 0.1, 1.2)
    # Where anchors_only does not pay either: real GRPO, every group executed.
    cheap = _map({None: 0.5, 30.0: 0.9, 300.0: 0.9})
    rec = regime_readout.readout(cheap, q=0.2, seconds=100.0, params=1e9)["recommendation"]
    assert (rec["arm"], rec["rho"], rec["ratio"]) == ("real_g2_lr0.001", 1.0, 1.0)


def test_readout_cost_cells_and_edges_are_said():
    m = _map()
    below = regime_readout.readout(m, q=0.8, seconds=5.0, params=1e9)
    assert below["cost"] is None and "below the map's cheapest" in below["notes"][0]
    assert below["recommendation"]["arm"] == "anchors_only"  # 0.8 < 1.5 at recorded seconds
    above = regime_readout.readout(m, q=0.6, seconds=5000.0, params=1e9)
    assert above["cost"] == 300.0 and "above the map's dearest" in above["notes"][0]
    assert above["recommendation"]["ratio"] == pytest.approx(3.0)
    edge = regime_readout.readout(m, q=0.95, seconds=300.0, params=0.0)
    assert edge["arms"]["wmrl"]["ratio_vs_best_real"] == pytest.approx(4.0)
    assert "outside the map's realised range" in edge["arms"]["wmrl"]["note"]
    assert any("model size not given" in n for n in edge["notes"])
    none = regime_readout.readout(m, q=None, seconds=300.0, params=1e9)
    assert none["arms"]["wmrl"]["ratio_vs_best_real"] is None
    assert "cannot be placed" in none["recommendation"]["why"]
    assert regime_readout.pick_params([1e9, 9e9], 4e9)[0] == 9e9  # nearest on a log scale
    assert regime_readout.pick_params([1e9, 9e9], 2e9)[0] == 1e9


def test_load_map_refuses_what_is_not_a_map(tmp_path):
    with pytest.raises(ValueError, match="make regime"):
        regime_readout.load_map(str(tmp_path / "absent.json"))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"analysis": {"rows": []}}))
    with pytest.raises(ValueError, match="not a regime map"):
        regime_readout.load_map(str(bad))


# -- the runner's pieces ------------------------------------------------------------------


def test_arrays_average_executions_and_call_a_failure_by_majority():
    ok, err = Outcome("ok", 0.6, 0.6, 1.0, 1.0), Outcome("error", -0.5, np.nan, np.nan, 1.0)
    rows = wm_probe.Rows(
        causes=["ok", "ok", "ok", "syntax_error"],
        pred=[0.1, 0.2, 0.3, np.nan],
        outcomes=[[ok, ok], [ok, err], [err, err, ok], []],
    )
    a = wm_probe.arrays(rows, 2)
    np.testing.assert_allclose(a["real"].ravel(), [0.6, 0.05, -2 / 15, np.nan])
    np.testing.assert_array_equal(a["failed"].ravel(), [False, False, True, False])
    assert np.isnan(a["pred"][1, 1]) and a["pred"].shape == (2, 2)


def test_measure_says_when_the_spearman_is_not_the_maps_q():
    config = probe_config.get_config("tiny_cpu:runlocal")
    run = {"environment": "replay", "replicates": 3, "source_replicates": 3}
    assert wm_probe.measure(run, config)["same_as_map_q"]
    one = wm_probe.measure({**run, "replicates": 1}, config)
    assert not one["same_as_map_q"] and "1 of the table's 3" in one["notes"][0]
    local = wm_probe.measure({**run, "environment": "local", "replicates": 1}, config)
    assert not local["same_as_map_q"] and "noisy draw" in local["notes"][0]


@pytest.mark.parametrize(
    "field, value, match",
    [("probe.k", 1, "probe.k must be >= 2"), ("probe.split", "dev", "probe.split"),
     ("probe.folds", 1, "probe.folds"), ("probe.regime", "/nonexistent/results.json",
                                          "make regime")],
)  # fmt: skip
def test_bad_probe_settings_fail_before_any_work(tmp_path, field, value, match):
    config = override(probe_config.get_config("tiny_cpu:runlocal"), **{field: value})
    with pytest.raises(ConfigError, match=match):
        wm_probe.probe(config, str(tmp_path))
    assert not os.listdir(tmp_path)


def test_more_replicates_than_the_source_has_are_refused(tmp_path):
    config = override(probe_config.get_config("tiny_cpu:runlocal"), **{
        "executor.kind": "replay", "probe.replicates": 4, "probe.max_tasks": 1,
    })  # fmt: skip
    with pytest.raises(ConfigError, match="probe.replicates=4 but the outcome source has 3"):
        wm_probe.probe(config, str(tmp_path))


def test_the_config_names_the_training_config():
    assert probe_config.get_config().executor.kind == "replay"  # the default: replayed
    assert probe_config.get_config("qwen3_4b_mledojo:runlocal").agent.kind == "text"
    path = os.path.join(REPO, "experiments", "configs", "tiny_cpu.py")
    assert probe_config.get_config(f"{path}:runlocal").num_steps == 2
    with pytest.raises(ValueError, match="no config"):
        probe_config.get_config("absent_config")


# -- whole runs ----------------------------------------------------------------------------


def test_recipe_probe_on_replay_with_a_synthetic_world_model(tmp_path):
    """The synthetic world model knows its own realised q: the probe must measure it."""
    regime_file = tmp_path / "results.json"
    regime_file.write_text(json.dumps(_map()))
    page = tmp_path / "wm_probe.md"
    page.write_text("a\n<!-- wm-probe:begin -->\nold\n<!-- wm-probe:end -->\n")
    config = override(probe_config.get_config("tiny_cpu:runlocal"), **{
        "executor.kind": "replay", "world_model.kind": "synthetic",
        "world_model.synthetic.q": 0.6, "probe.k": 6, "probe.max_tasks": 5,
        "probe.execution_seconds": 100.0, "probe.regime": str(regime_file),
    })  # fmt: skip
    workdir = tmp_path / "probe"
    payload = wm_probe.run(config, str(workdir), docs=str(page))
    diag = [d for d in payload["wm_diagnostics"] if d["q_groups"] > 0]
    weights = np.array([d["q_groups"] for d in diag])
    q_wm = np.sum(weights * [d["q_realised"] for d in diag]) / weights.sum()
    spearman = payload["metrics"]["spearman"]
    assert spearman["groups"] == weights.sum() > 0
    assert spearman["mean"] == pytest.approx(q_wm, abs=1e-5)
    # The pairs, recounted from the programs' rows (task-major, k per task).
    rows = payload["programs"]
    assert len(rows) == 30 and all(len(r["rewards"]) == 3 for r in rows)
    pred = np.array([r["pred"] for r in rows]).reshape(5, 6)
    real = np.array([np.mean(r["rewards"]) for r in rows]).reshape(5, 6)
    ref = wm_metrics.pairwise_accuracy(pred, real)
    assert payload["metrics"]["pairwise"] == ref
    assert payload["measure"]["same_as_map_q"]
    assert payload["counts"]["executions"] <= 3 * len({(r["task"], r["label"]) for r in rows})
    # Failures, recounted the same way: a program fails when most of its runs did.
    failed = np.array([np.mean([s == "ok" for s in r["statuses"]]) < 0.5 for r in rows])
    assert payload["metrics"]["failure_auc"] == wm_metrics.failure_auc(pred, failed.reshape(5, 6))
    r = payload["regime"]
    assert r["available"] and r["cost"] == 30.0
    assert r["arms"]["wmrl"]["ratio_vs_best_real"] == pytest.approx(
        float(np.interp(spearman["mean"], [0.0, 0.4, 0.8], [0.5, 1.0, 2.0])), abs=1e-9
    )
    report = (workdir / "report.md").read_text()
    assert "**Recommendation:** `wmrl` (ρ = 0.1" in report
    assert "same measure, but" in report
    assert json.loads((workdir / "results.json").read_text())["run"]["k"] == 6
    text = page.read_text()
    assert "\nold\n" not in text and "within-group Spearman" in text and text.startswith("a\n")


def test_entry_point_runs_renders_and_refuses_a_typo(tmp_path):
    def launch(*flags):
        cmd = [sys.executable, "-m", "experiments.wm_probe", f"--workdir={tmp_path}", *flags]
        return subprocess.run(
            cmd, cwd=REPO, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True,
            text=True, timeout=900,
        )  # fmt: skip

    config = "--config=experiments/configs/wm_probe.py:tiny_cpu:runlocal"
    typo = launch(config, "--config.probe.kk=3")
    assert typo.returncode != 0 and "kk" in typo.stderr and not os.listdir(tmp_path)
    flags = ("--config.executor.kind=replay", "--config.probe.max_tasks=3",
             "--config.probe.k=4", "--config.probe.replicates=1")  # fmt: skip
    proc = launch(config, *flags)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| within-group Spearman |" in proc.stdout
    assert "No regime map is available" in proc.stdout and "make regime" in proc.stdout
    payload = json.loads((tmp_path / "results.json").read_text())
    assert payload["run"]["replicates"] == 1 and payload["counts"]["rows"] == 12
    assert not payload["measure"]["same_as_map_q"]
    report = (tmp_path / "report.md").read_text()
    again = launch(config, "--render_only")
    assert again.returncode == 0, again.stderr[-3000:]
    assert (tmp_path / "report.md").read_text() == report


@pytest.mark.skipif(
    not os.path.isfile(os.path.join(REPO, TUNED, "fixture.json")),
    reason=f"no tuned checkpoint at {TUNED}: python -m wmrl_jax.agents.text.fixture builds it",
)
def test_text_agent_probe_on_the_tiny_fixture_executes_locally(tmp_path):
    with open(os.path.join(REPO, TUNED, "fixture.json"), encoding="utf-8") as f:
        shape = json.load(f)["shape"]
    fields = {f"agent.text.{k}": v for k, v in shape.items()}
    config = override(probe_config.get_config("qwen3_4b_mledojo:runlocal"), **{
        **fields, "agent.text.checkpoint": os.path.join(REPO, TUNED),
        "executor.kind": "local", "probe.k": 4,
        "probe.max_tasks": 3, "probe.split": "both",
    })  # fmt: skip
    payload = wm_probe.probe(config, str(tmp_path))
    c, m = payload["counts"], payload["metrics"]
    assert payload["run"]["environment"] == "local" and c["rows"] == 12
    assert c["executions"] > 0 and c["rows"] == sum(1 for _ in payload["programs"])
    both = [r for r in payload["programs"] if r["pred"] is not None and r["rewards"]]
    assert both, payload["programs"]
    assert m["failure_auc"]["programs"] == len(both) == m["calibration"]["programs"]
    assert m["failure_auc"]["failures"] == sum(
        np.mean([s == "ok" for s in r["statuses"]]) < 0.5 for r in both
    )
    assert not payload["measure"]["same_as_map_q"]
    assert any("recipe agent" in n for n in payload["measure"]["notes"])
    assert m["spearman"]["of"] == 3
