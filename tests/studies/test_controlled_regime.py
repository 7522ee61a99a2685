"""The controlled regime map: novel programs, counts, pricing and the analysis by hand,
and the command end to end on a tiny config."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import controlled as controlled_config
from wmrl_jax.studies import controlled, controlled_regime, controlled_regime_report
from wmrl_jax.train.cost import CostModel, TokenLengths


def test_program_quality_is_the_candidate_without_novelty_and_fresh_noise_with_it():
    key = jax.random.key(3)
    candidate = jnp.full((200, 50), 0.4)
    assert controlled.program_quality(key, candidate, 0.0) is candidate  # draws nothing
    novel = np.asarray(controlled.program_quality(key, candidate, 0.15), np.float64)
    # 10,000 draws of 0.4 + 0.15 N(0, 1): mean within 4 s.e. (0.006), sd within 3%.
    assert abs(novel.mean() - 0.4) < 4 * 0.15 / 100
    assert abs(novel.std() / 0.15 - 1) < 0.03
    other = controlled.program_quality(jax.random.key(4), candidate, 0.15)
    assert not np.allclose(novel, other)  # a new program per step key


def test_novelty_changes_the_programs_not_the_policys_expected_reward_at_the_start():
    config = controlled_config.get_config("regime_runlocal")
    key = jax.random.key(0)
    novel = controlled.run_arm(config, "real", key)
    plain = controlled_config.get_config("regime_runlocal")
    with plain.unlocked():
        plain.env.novelty = 0.0
    recurring = controlled.run_arm(plain, "real", key)
    # Step 0: the same uniform policy over the same environment.
    assert float(novel["true_reward"][0]) == float(recurring["true_reward"][0])
    # The novel part is in the programs the groups hold: their errors against the
    # candidates' qualities differ (bias of fed rewards: real − program quality).
    assert not np.allclose(novel["true_reward"], recurring["true_reward"])
    with pytest.raises(ValueError, match="novelty"):
        bad = controlled_config.get_config("regime_runlocal")
        with bad.unlocked():
            bad.env.novelty = -0.1
        controlled.run_arm(bad, "real", key)


def test_counts_sample_only_what_a_real_cell_executes():
    config = controlled_config.get_config("regime_runlocal")  # 10 groups of 8 per update
    executions = np.array([[8.0, 16.0]])
    real = controlled_regime.counts_of("real", config, executions)
    alone = controlled_regime.counts_of("anchors_only", config, executions)
    wm = controlled_regime.counts_of("wmrl", config, executions)
    assert real["samples"].tolist() == [[80.0, 80.0]] and real["wm_rows"].tolist() == [[0, 0]]
    assert alone["samples"].tolist() == alone["train_rows"].tolist() == [[8.0, 16.0]]
    assert wm["wm_rows"].tolist() == wm["train_rows"].tolist() == [[80.0, 80.0]]
    assert wm["executions"].tolist() == [[8.0, 16.0]]


def test_priced_compute_by_hand():
    model = CostModel(params=1e9, peak_flops=1e15, mfu=0.5, lengths=TokenLengths(10, 20, 30))
    run = {"samples": np.array([[4.0, 4.0]]), "wm_rows": np.array([[4.0, 4.0]]),
           "train_rows": np.array([[4.0, 4.0]]), "executions": np.array([[1.0, 2.0]])}  # fmt: skip
    tokens = (2e9 * (4 * 10 + 4 * 20) + 6e9 * 4 * 30) / (1e15 * 0.5)  # 0.00192 s per update
    want = np.cumsum([tokens + 1 * 300.0, tokens + 2 * 300.0])
    np.testing.assert_allclose(controlled_regime.priced(run, model, 300.0), [want], rtol=1e-12)


def _run(curve, executions, wm_rows=0.0, q=np.nan):
    steps = len(curve)
    ex = np.full((1, steps), float(executions))
    return {"true_reward": np.array([curve], np.float64), "executions": ex, "samples": ex,
            "train_rows": ex, "wm_rows": np.full((1, steps), wm_rows),
            "wm_q_realised": np.full((1, steps), q)}  # fmt: skip


def test_analysis_by_hand_best_real_is_the_cheapest_real_cell_per_seed():
    # Tokens cost nothing here (a 1-parameter model): compute = executions x cost.
    model = CostModel(params=1.0, peak_flops=1e30, mfu=1.0, lengths=TokenLengths(1, 1, 1))
    results = {
        "real": _run([0.0, 0.5, 0.8, 1.0], 10),  # target 1.0, reached at 40 executions
        "anchors_only": _run([0.0, 0.2, 0.4, 0.5], 1),  # never
        "real_g5": _run([0.0, 0.6, 1.0, 1.0], 5),  # at 15: the best real cell
        "wmrl_q0.5": _run([0.0, 0.5, 1.0, 1.0], 1, wm_rows=8.0, q=0.45),  # at 3
    }
    a = controlled_regime.analyse(
        results, arms=("wmrl",), model=model, costs=(2.0,), params=(1.0,), smooth=1,
        fraction=1.0, margin=0.02,
    )  # fmt: skip
    assert a["best_real_picks"] == {"2s|N1": ["real_g5"]}
    (row,) = a["rows"]
    assert row["label"] == "wmrl_q0.5" and row["q"] == 0.5 and row["q_realised"] == 0.45
    assert row["ratio_vs_best_real"]["median"] == pytest.approx(15 / 3)
    # anchors_only never reaches it: its whole compute (4 executions) over the run's 3.
    assert row["ratio_vs_anchors_only"]["median"] == pytest.approx(4 / 3)
    assert row["ratio_vs_anchors_only"]["other_never"] == 1
    assert a["anchors_only_vs_best_real"]["2s|N1"]["run_never"] == 1
    assert row["vs_anchors_only"]["mean"] == pytest.approx(0.5)  # final 1.0 − 0.5
    assert a["real_finals"] == pytest.approx({"real": 1.0, "anchors_only": 0.5, "real_g5": 1.0})
    (be,) = a["break_even"]
    assert be["q_break_even"] == pytest.approx(0.45)  # the one cell is already above 1


def test_command_end_to_end(tmp_path):
    config = controlled_config.get_config("regime_runlocal")
    with config.unlocked():
        config.regime.arms, config.regime.q, config.regime.real_groups = ("wmrl",), (0.8,), ()
        config.num_steps = 20
    readme, docs = tmp_path / "README.md", tmp_path / "regime.md"
    readme.write_text(
        "x\n<!-- regime-controlled-headline:begin -->\n<!-- regime-controlled-headline:end -->\n"
    )
    docs.write_text("y\n<!-- regime-controlled:begin -->\n<!-- regime-controlled:end -->\n")
    out = tmp_path / "out"
    a = controlled_regime_report.run_and_report(config, str(out), str(readme), str(docs))
    payload = json.loads((out / "results.json").read_text())
    assert set(payload["curves"]) == {"real", "anchors_only", "wmrl_q0.8"}
    assert {r["label"] for r in a["rows"]} == {"wmrl_q0.8"}
    assert len(a["rows"]) == 2  # two costs, one N
    assert (out / controlled_regime_report.PNG).is_file()
    assert (tmp_path / controlled_regime_report.PNG).is_file()  # beside the page
    head = readme.read_text()
    assert "In the controlled study" in head and "- `wmrl`: at its highest realised q" in head
    assert "| wmrl_q0.8 | 0.8 |" in docs.read_text()
    assert "`wmrl` (N = 1B, medians over seeds)" in docs.read_text()
