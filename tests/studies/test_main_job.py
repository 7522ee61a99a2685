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
    said = main_job.headline({"runs": _runs([(0.40, 0.50), (0.40, 0.52), (0.30, 0.41)]),
                              "analysis": up})  # fmt: skip
    assert "more than two standard errors (19.1)" in said
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


def test_under_replay_the_verdict_reads_the_exact_measure():
    # The sampled measure rises by 0.11 (se 0.006); the exact one by 0.01, 0.03, -0.01
    # (mean 0.01, sd 0.02, se 0.01155): the declared exact measure decides, no gain.
    runs = _runs([(0.40, 0.50), (0.40, 0.52), (0.30, 0.41)])
    for r, (b, a) in zip(runs.values(), [(0.40, 0.41), (0.42, 0.45), (0.38, 0.37)], strict=True):
        r.update(exact_before=b, exact_after=a)
    a = main_job.analyse(runs)
    assert a["measure"] == "exact" and not a["improves_heldout"]
    assert a["rise"]["mean"] == pytest.approx(0.01)
    assert a["rise"]["se"] == pytest.approx(0.02 / 3**0.5)
    assert a["rise_sampled"]["mean"] == pytest.approx(0.11)
    text = main_job.headline({"runs": runs, "analysis": a})
    assert "exact expected held-out percentile by +0.010" in text
    assert "(the sampled measure: +0.110" in text
    # A run without the exact measure (e.g. executed for real): the sampled one decides.
    del runs["2"]["exact_after"]
    assert main_job.analyse(runs)["measure"] == "sampled"


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
    # Replayed: the exact measure, declared, decides; the sampled one is beside it.
    assert results["analysis"]["measure"] == "exact"
    for r in results["runs"].values():
        assert 0.0 <= r["exact_before"] <= 1.0 and 0.0 <= r["exact_after"] <= 1.0
    assert "| 0 |" in page.read_text() and "exact expected" in readme.read_text()
    # Finished seeds are read back, not trained again; a lost one is rerun alone, and one
    # that finished before the exact measure gets it from its last checkpoint: the same
    # values as the trained params gave.
    shutil.rmtree(workdir / "seed_1")
    path = workdir / "seed_0" / "summary.json"
    old = json.loads(path.read_text())
    path.write_text(json.dumps({k: v for k, v in old.items() if not k.startswith("exact_")}))
    steps = []
    real = main_job.loop.Trainer._step

    def counting(self, step):
        steps.append((self.config.seed, step))
        return real(self, step)

    monkeypatch.setattr(main_job.loop.Trainer, "_step", counting)
    main_job.run_and_report(config, str(workdir), str(readme), None)
    assert steps == [(1, 1), (1, 2)]
    again = json.loads((workdir / "results.json").read_text())["runs"]
    assert again["0"] == results["runs"]["0"]
    measures = ("heldout_before", "heldout_after", "exact_before", "exact_after")
    assert {k: again["1"][k] for k in measures} == {k: results["runs"]["1"][k] for k in measures}
