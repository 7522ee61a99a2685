"""The controlled study end to end: the absl command, its outputs and claims."""

import json
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import pytest

from experiments.configs import controlled as controlled_config
from wmrl_jax.studies import controlled


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("controlled")
    readme = workdir / "README.md"
    readme.write_text(
        "# x\n<!-- controlled-headline:begin -->\nold\n<!-- controlled-headline:end -->\n"
    )
    (workdir / "docs").mkdir()
    page = workdir / "docs" / "controlled_study.md"
    page.write_text("# x\n<!-- controlled:begin -->\nold\n<!-- controlled:end -->\ntail\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.controlled",
            "--config=experiments/configs/controlled.py:runlocal",
            f"--workdir={workdir}",
            f"--readme={readme}",
        ],
        capture_output=True,
        text=True,
        # A guard against a hang, not a time bound: a loaded 2-core machine took > 600 s.
        timeout=3600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return workdir, proc.stdout


def test_outputs_written(study):
    workdir, stdout = study
    payload = json.loads((workdir / "results.json").read_text())
    arms = controlled_config.get_config("runlocal").arms
    assert set(payload["summary"]) == set(arms) and "anchors_only" in arms
    assert payload["config"]["anchor_fraction"] == 0.1
    assert (workdir / "controlled.png").stat().st_size > 10_000
    table = (workdir / "table.md").read_text()
    assert table.strip() in stdout
    assert all(f"| {arm} |" in table for arm in arms)


def test_blind_spot_sweep_table_and_readme(study):
    workdir, stdout = study
    payload = json.loads((workdir / "results.json").read_text())
    sweep = payload["blind_spot_sweep"]
    assert set(sweep) == {"0.0", "0.15"}
    # The config's own fraction is the main study, not a rerun.
    assert sweep["0.15"] == payload["summary"]
    assert (
        sweep["0.0"]["wm_naive"]["final_true_reward"]
        != sweep["0.15"]["wm_naive"]["final_true_reward"]
    )
    table = (workdir / "table.md").read_text()
    assert "| 0% |" in table and "| 15% |" in table and "wins among the arms" in table
    page = (workdir / "docs" / "controlled_study.md").read_text()
    assert "old" not in page and table.strip() in page and page.endswith("tail\n")
    readme = (workdir / "README.md").read_text()
    assert "old" not in readme and "Best among the arms executing no more than `wmrl`" in readme
    # The estimators against their control, paired, at each fraction, table and headline.
    assert "Each estimator against its control `anchors_only`" in table
    for fraction in ("0%", "15%"):
        assert f"| {fraction} | wmrl_ppi | " in table and f"| {fraction} | wmrl | " in table
    assert "`wmrl_ppi` against `anchors_only` (paired over seeds, margin 0.02)" in readme
    assert len(payload["summary"]["wmrl_ppi"]["final_true_reward_seeds"]) == 2
    assert "| 15% |" not in readme
    # --render_only writes the same tables from results.json alone.
    (workdir / "table.md").unlink()
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.controlled", f"--workdir={workdir}", "--render_only"],
        capture_output=True, text=True, timeout=1800, check=False,  # a hang guard
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (workdir / "table.md").read_text() == table


def test_winners_are_the_best_arm_and_its_statistical_ties():
    summary = {
        "a": {"final_true_reward": 0.80, "final_true_reward_se": 0.01},
        "b": {"final_true_reward": 0.78, "final_true_reward_se": 0.01},  # 0.02 < 2·0.014
        "c": {"final_true_reward": 0.70, "final_true_reward_se": 0.01},
    }
    assert controlled.winners(summary) == ["a", "b"]
    assert controlled.winners(summary, z=1.0) == ["a"]


def test_study_claims(study):
    summary = json.loads((study[0] / "results.json").read_text())["summary"]
    real, naive, debias, wmrl = (summary[a] for a in ("real", "wm_naive", "wm_debias", "wmrl"))
    anchors_only = summary["anchors_only"]
    # Executions: everything for `real`, none for `wm_naive`, ρ of groups otherwise.
    assert naive["total_executions"] == 0
    assert wmrl["total_executions"] == pytest.approx(0.1 * real["total_executions"])
    # The control executes exactly what wmrl executes and feeds real scores only.
    assert anchors_only["total_executions"] == wmrl["total_executions"]
    assert anchors_only["anchor_var_fed"] == pytest.approx(anchors_only["anchor_var_real"])
    # Debiasing shrinks the bias of the WM stream; the naive arm feeds it raw.
    for arm in (debias, wmrl):
        assert abs(arm["debiased_wm_bias_last_half"]) < 0.5 * abs(arm["raw_wm_bias_last_half"])
    assert abs(naive["bias_last_quarter"]) > 2 * abs(wmrl["bias_last_quarter"])
    # IVD: fused rewards on anchors have less error variance than either stream.
    assert wmrl["anchor_var_fed"] < wmrl["anchor_var_real"]
    assert wmrl["anchor_var_fed"] < wmrl["anchor_var_debiased"]
    # Without IVD the anchors feed the real stream as is.
    assert debias["anchor_var_fed"] == pytest.approx(debias["anchor_var_real"])


@pytest.mark.parametrize("arm", ["wmrl", "anchors_only", "wmrl_ppi"])
def test_run_arm_is_deterministic_finite_and_validates_arm(arm):
    config = controlled_config.get_config("runlocal")
    with config.unlocked():
        config.num_steps = 5
    run = jax.jit(lambda k: controlled.run_arm(config, arm, k))
    a, b = run(jax.random.key(3)), run(jax.random.key(3))
    own = ("reliability", "wm_correlation")  # only where the arm forms λ (`core.ppi`)
    for k in a:  # Every output of these arms is defined at every step.
        if k in own and arm != "wmrl_ppi":
            assert np.isnan(a[k]).all(), k
        else:
            assert np.isfinite(a[k]).all(), k
        np.testing.assert_array_equal(a[k], b[k])
    assert np.all(a["grad_error"] >= 0) and np.all(a["grad_real"] > 0)
    with pytest.raises(ValueError, match="unknown arm"):
        controlled.run_arm(config, "bogus", jax.random.key(0))


def test_config_variants_and_lock():
    with pytest.raises(ValueError, match="unknown config variant"):
        controlled_config.get_config("bogus")
    config = controlled_config.get_config()
    assert isinstance(config, ml_collections.ConfigDict)
    with pytest.raises(AttributeError):
        config.anchor_fractoin = 0.2  # A typo fails: the config is locked.


def test_adaptive_rho_without_gain_is_wmrl_and_with_gain_moves_the_count():
    config = controlled_config.get_config("runlocal")
    with config.unlocked():
        config.num_steps = 30
        config.anchors.adaptive.warmup_steps = 2
        config.anchors.adaptive.fast_halflife = 1.0
        config.anchors.adaptive.slow_halflife = 20.0
        config.anchors.adaptive.gain = 0.0
    key = jax.random.key(5)
    wmrl = controlled.run_arm(config, "wmrl", key)
    flat = controlled.run_arm(config, "wmrl_adaptive", key)
    for k in wmrl:  # ρ_t ≡ ρ: the same anchors, the same run
        np.testing.assert_array_equal(wmrl[k], flat[k], err_msg=k)
    with config.unlocked():
        config.anchors.adaptive.gain = 2.0
    moving = np.asarray(controlled.run_arm(config, "wmrl_adaptive", key)["executions"])
    g, b = config.group_size, config.tasks_per_step
    assert np.all(moving % g == 0) and moving.max() <= np.ceil(0.3 * b) * g
    assert len(np.unique(moving)) > 1  # the error's drift changes the count
