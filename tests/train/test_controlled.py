"""The controlled study end to end: the absl command, its outputs and claims."""

import json
import subprocess
import sys

import jax
import ml_collections
import pytest

from experiments.configs import controlled as controlled_config
from wmrl_jax.train import controlled


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("controlled")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.controlled",
            "--config=experiments/configs/controlled.py:runlocal",
            f"--workdir={workdir}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return workdir, proc.stdout


def test_outputs_written(study):
    workdir, stdout = study
    payload = json.loads((workdir / "results.json").read_text())
    assert set(payload["summary"]) == set(controlled.ARMS)
    assert payload["config"]["anchor_fraction"] == 0.1
    assert (workdir / "controlled.png").stat().st_size > 10_000
    table = (workdir / "table.md").read_text()
    assert table.strip() in stdout
    assert all(f"| {arm} |" in table for arm in controlled.ARMS)


def test_study_claims(study):
    summary = json.loads((study[0] / "results.json").read_text())["summary"]
    real, naive, debias, wmrl = (summary[a] for a in controlled.ARMS)
    # Executions: everything for `real`, none for `wm_naive`, ρ of groups otherwise.
    assert naive["total_executions"] == 0
    assert wmrl["total_executions"] == pytest.approx(0.1 * real["total_executions"])
    # Debiasing shrinks the bias of the WM stream; the naive arm feeds it raw.
    for arm in (debias, wmrl):
        assert abs(arm["debiased_wm_bias_last_half"]) < 0.5 * abs(arm["raw_wm_bias_last_half"])
    assert abs(naive["bias_last_quarter"]) > 2 * abs(wmrl["bias_last_quarter"])
    # IVD: fused rewards on anchors have less error variance than either stream.
    assert wmrl["anchor_var_fed"] < wmrl["anchor_var_real"]
    assert wmrl["anchor_var_fed"] < wmrl["anchor_var_debiased"]
    # Without IVD the anchors feed the real stream as is.
    assert debias["anchor_var_fed"] == pytest.approx(debias["anchor_var_real"])


def test_run_arm_is_deterministic_and_validates_arm():
    config = controlled_config.get_config("runlocal")
    with config.unlocked():
        config.num_steps = 5
    run = jax.jit(lambda k: controlled.run_arm(config, "wmrl", k))
    a, b = run(jax.random.key(3)), run(jax.random.key(3))
    assert all((a[k] == b[k]).all() | (a[k] != a[k]).all() for k in a)
    with pytest.raises(ValueError, match="arm must be one of"):
        controlled.run_arm(config, "bogus", jax.random.key(0))


def test_config_variants_and_lock():
    with pytest.raises(ValueError, match="unknown config variant"):
        controlled_config.get_config("bogus")
    config = controlled_config.get_config()
    assert isinstance(config, ml_collections.ConfigDict)
    with pytest.raises(AttributeError):
        config.anchor_fractoin = 0.2  # A typo fails: the config is locked.
