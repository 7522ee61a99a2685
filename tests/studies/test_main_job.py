"""The main job over seeds: the paired verdict by hand, and the command end to end."""

import json
import shutil

import pytest

from experiments.configs import main_job as main_job_config
from wmrl_jax.studies import main_job


def _runs(pairs):
    return {
        str(s): {"heldout_before": b, "heldout_after": a, "fed_reward_first5": 0.4,
                 "fed_reward_last5": 0.5, "executions": 200.0}
        for s, (b, a) in enumerate(pairs)
    }  # fmt: skip


def test_the_verdict_is_a_paired_rise_beyond_two_standard_errors():
    # Rises 0.10, 0.12, 0.11: mean 0.11, sd 0.01, se 0.01/sqrt(3) = 0.00577.
    up = main_job.analyse(_runs([(0.40, 0.50), (0.40, 0.52), (0.30, 0.41)]))
    assert up["improves_heldout"] and up["rise"]["n"] == 3
    assert up["rise"]["mean"] == pytest.approx(0.11)
    assert up["rise"]["se"] == pytest.approx(0.01 / 3**0.5)
    # The three replayed seeds measured before the task observations: +0.116, +0.055,
    # -0.091: mean +0.027, se 0.061, not a gain.
    mixed = main_job.analyse(_runs([(0.386, 0.502), (0.437, 0.492), (0.407, 0.316)]))
    assert not mixed["improves_heldout"]
    assert mixed["rise"]["mean"] == pytest.approx(0.02667, abs=1e-4)
    text = main_job.headline({"runs": _runs([(0.386, 0.502), (0.437, 0.492), (0.407, 0.316)]),
                              "analysis": mixed})  # fmt: skip
    assert "does not show a held-out gain" in text and "0.400" in text and "0.500" in text
    # A fall beyond two standard errors is said as a fall.
    down = _runs([(0.48, 0.26), (0.45, 0.30), (0.50, 0.28)])
    fell = main_job.headline({"runs": down, "analysis": main_job.analyse(down)})
    assert "**lowers**" in fell and "hurts them" in fell
    # One seed: no verdict.
    assert not main_job.analyse(_runs([(0.3, 0.9)]))["improves_heldout"]


def test_command_runs_each_seed_writes_the_report_and_reads_finished_runs_back(
    tmp_path, monkeypatch
):
    readme = tmp_path / "README.md"
    readme.write_text("<!-- main-job-headline:begin -->\nx\n<!-- main-job-headline:end -->\n")
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "main_job.md"
    page.write_text("<!-- main-job:begin -->\nx\n<!-- main-job:end -->\n")
    config = main_job_config.get_config("runlocal")
    workdir = tmp_path / "out"
    main_job.run_and_report(config, str(workdir), str(readme), None)
    results = json.loads((workdir / "results.json").read_text())
    assert set(results["runs"]) == {"0", "1"}
    for r in results["runs"].values():
        assert 0.0 <= r["heldout_before"] <= 1.0 and 0.0 <= r["heldout_after"] <= 1.0
        assert r["executions"] > 0
    assert results["analysis"]["rise"]["n"] == 2
    assert "| 0 |" in page.read_text() and "seeds" in readme.read_text()
    # Finished seeds are read back, not trained again; a lost one is rerun alone.
    shutil.rmtree(workdir / "seed_1")
    trained = []
    real = main_job.loop.train_and_evaluate

    def counting(config, workdir):
        trained.append(config.seed)
        return real(config, workdir)

    monkeypatch.setattr(main_job.loop, "train_and_evaluate", counting)
    main_job.run_and_report(config, str(workdir), str(readme), None)
    assert trained == [1]
