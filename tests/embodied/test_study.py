"""The study's analysis and report by hand, and the study command end to end (runlocal)."""

import json

import pytest

from wmrl_jax.embodied import report, study


def _run(successes, steps=(0, 100, 200, 300)):
    curve = [
        {"sim_steps": s, "success": v, "return": 0.0} for s, v in zip(steps, successes, strict=True)
    ]
    ledger = {
        k: 1.0
        for k in (
            "sim_steps",
            "full_episodes",
            "prefix_episodes",
            "sim_seconds",
            "policy_seconds",
            "wm_seconds",
            "train_seconds",
        )
    }
    return {"curve": curve, "ledger": ledger, "updates": 3, "wm_rank_corr": float("nan")}


def test_analyse_by_hand():
    results = {
        "reacher": {
            "config": {},
            "arms": {
                # real ends at 0.6 (mean of 0.5, 0.7) and crosses 0.6 at step 300.
                "real": [_run([0.0, 0.2, 0.4, 0.5]), _run([0.0, 0.2, 0.4, 0.7])],
                # wmrl's mean crosses 0.6 halfway between 100 (0.4) and 200 (0.8): 150.
                "wmrl": [_run([0.0, 0.4, 0.8, 0.8]), _run([0.0, 0.4, 0.8, 0.8])],
                "wm_naive": [_run([0.0, 0.1, 0.0, 0.0]), _run([0.0, 0.0, 0.1, 0.0])],
            },
        }
    }
    a = study.analyse(results, bootstrap=200)["reacher"]
    assert a["real"]["at_final"]["target"] == pytest.approx(0.6)
    assert a["real"]["at_final"]["steps"] == pytest.approx(300.0)
    assert a["wmrl"]["at_final"]["steps"] == pytest.approx(150.0)
    assert a["wmrl"]["at_final"]["ratio"] == pytest.approx(2.0)
    assert a["wmrl"]["at_final"]["ratio_lo"] <= 2.0 <= a["wmrl"]["at_final"]["ratio_hi"]
    # 90% of 0.6 = 0.54: real at 200 + 100 * 0.14 / 0.2 = 270, wmrl at 100 + 100 * 0.14 / 0.4 = 135.
    assert a["wmrl"]["at_90"]["ratio"] == pytest.approx(270.0 / 135.0)
    assert a["wm_naive"]["at_final"]["ratio"] is None
    assert a["wm_naive"]["at_final"]["seeds_reaching"] == 0
    assert a["real"]["final_se"] == pytest.approx(0.1)  # std(0.5, 0.7) / sqrt(2)
    full = study.analyse(results, bootstrap=10)
    assert "2.00×" in report.headline(full) and "falls short of" in report.headline(full)
    assert (
        "| reacher | wm_naive | 0.00 → 0.00 ± 0.00 | never (0/2) | never (0/2) |"
        in report.table(full)
    )


def test_flat_real_is_not_measurable():
    results = {
        "pusher": {"config": {}, "arms": {"real": [_run([0.0] * 4)], "wmrl": [_run([0.0] * 4)]}}
    }
    a = study.analyse(results, bootstrap=10)
    assert not a["pusher"]["wmrl"]["measurable"]
    assert a["pusher"]["wmrl"]["at_final"]["ratio"] is None
    assert "not measurable" in report.headline(a)


def test_study_command_end_to_end(tmp_path, monkeypatch):
    pytest.importorskip("gymnasium")
    from experiments import study_embodied
    from experiments.configs import embodied

    config = embodied.get_config("runlocal")
    monkeypatch.chdir(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text(
        "# x\n<!-- embodied-headline:begin -->\nold\n<!-- embodied-headline:end -->\n"
    )
    page = tmp_path / "docs" / "embodied.md"
    page.parent.mkdir()
    page.write_text("# x\n<!-- embodied:begin -->\nold\n<!-- embodied:end -->\n")
    monkeypatch.chdir(tmp_path / "docs")  # The plot goes beside the page, wherever the cwd is.
    analysis = study_embodied.run_and_report(config, str(tmp_path / "out"), str(readme))
    text = page.read_text()
    assert "old" not in text and "| reacher | wmrl |" in text and "(embodied.png)" in text
    assert (tmp_path / "docs" / "embodied.png").stat().st_size > 1000
    assert "CPU-min in the runs" in text
    head = readme.read_text()
    assert "old" not in head and "| reacher |" not in head
    assert report.headline(analysis) in head and report.headline(analysis) in text
    payload = json.loads((tmp_path / "out" / "results.json").read_text())
    runs = payload["results"]["reacher"]["arms"]
    budget, h, k = config.tasks.reacher.budget, 50, config.tasks.reacher.prefix_len
    g = config.tasks.reacher.group_size
    for arm in config.arms:
        (run,) = runs[arm]
        ledger = run["ledger"]
        assert ledger["sim_steps"] >= budget
        assert [p["sim_steps"] for p in run["curve"]] == [0, budget]
        # Every charged step is accounted for by the episodes the arm ran.
        expected = (
            ledger["full_episodes"] * h
            + ledger["prefix_episodes"] * k
            + ledger["replicate_steps"]
            + ledger["warm_start_steps"]
        )
        assert ledger["sim_steps"] == expected, arm
    assert runs["real"][0]["ledger"]["prefix_episodes"] == 0
    assert (
        runs["anchors_only"][0]["ledger"]["full_episodes"] == g * runs["anchors_only"][0]["updates"]
    )
    assert runs["wm_naive"][0]["ledger"]["full_episodes"] == 0
    assert runs["wmrl"][0]["ledger"]["replicate_steps"] > 0
    assert set(analysis["reacher"]) == set(config.arms)
    with pytest.raises(ValueError, match="unknown config variant"):
        embodied.get_config("huge")
    full = embodied.get_config()
    assert full.num_seeds >= 5 and set(full.tasks) == {"reacher", "pendulum"}
    with pytest.raises(AttributeError):  # Locked, down to the run configs: a typo fails.
        full.tasks.reacher.policy.learning_rat = 1.0
