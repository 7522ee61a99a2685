"""The board checks as shares: real boards of seed 0, bootstrap shares, the README table."""

import os

import numpy as np
import pytest
from sklearn import metrics as sk_metrics

from wmrl_jax.envs import board_checks, board_structure, suite
from wmrl_jax.envs.board_checks import BoardCheck, NoiseCheck
from wmrl_jax.envs.ensembles import BASELINE_ENTRY


def test_seed0_boards_are_sound_and_checked(builtin_suite):
    dirs = [os.path.join(builtin_suite, s.id) for s in suite.suite_specs()]
    assert {d: board_structure.structural_problems(d) for d in dirs} == {d: [] for d in dirs}
    checks = [board_checks.check_board(d) for d in dirs]
    for c in checks:
        assert c.board_size >= 200
        want = (c.sample <= 0.10, 0.5 <= c.baseline <= 0.75, c.ensemble >= 0.95)
        assert (c.sample_ok, c.baseline_ok, c.ensemble_ok) == want, c.line()
        assert c.passed == all(want) and c.ensemble_entry.startswith("ensemble_")


def _check(name: str, ok: bool) -> BoardCheck:
    return BoardCheck(name, 234, 0.0, 0.6 if ok else 0.9, 0.99, "ensemble_top1", True, ok, True)


def test_passing_share():
    checks = [_check(f"t{k}", k != 0) for k in range(5)]
    assert board_checks.passing_share(checks) == 0.8
    assert board_checks.passing_share(checks[:1]) == 0.0
    with pytest.raises(ValueError, match="at least one"):
        board_checks.passing_share([])


def test_check_board_needs_baseline_and_ensembles(make_task):
    with pytest.raises(ValueError, match="lacks"):
        board_checks.check_board(make_task())


def _offset_board(baseline_offset: float):
    """Entries off the truth by constant offsets: RMSE = |offset| on any resample of the rows."""
    offsets = {"prior": 9.0} | {f"single{k}": 1.0 + k for k in range(7)}  # 11 entries in all.
    offsets |= {"ensemble_top0": 0.5, "ensemble_top1": 3.5, BASELINE_ENTRY: baseline_offset}
    y = np.linspace(-1.0, 1.0, 20)
    names = list(offsets)
    return names, [y + offsets[n] for n in names], y


@pytest.mark.parametrize(
    "offset, want_baseline, ok", [(2.25, 7.5 / 11, 1.0), (0.75, 9.5 / 11, 0.0)]
)
def test_resampled_positions_on_a_board_that_resampling_cannot_move(offset, want_baseline, ok):
    names, preds, y = _offset_board(offset)
    score = lambda yt, p: float(np.sqrt(np.mean((p - yt) ** 2)))
    pos = board_checks.resampled_positions(
        names, preds, y, sample="prior", score=score, direction="lower", rule="mid_rank",
        resamples=30,
    )  # fmt: skip
    assert pos.shape == (30, 3)
    np.testing.assert_allclose(pos[:, 0], 0.5 / 11)  # The prior is last: half its own tie.
    np.testing.assert_allclose(pos[:, 1], want_baseline)  # 7 or 9 worse + half its tie.
    np.testing.assert_allclose(pos[:, 2], 10.5 / 11)  # The best ensemble tops the board.
    holds = board_checks.checks_hold(pos[:, 0], pos[:, 1], pos[:, 2])
    assert np.mean(holds[0] & holds[1] & holds[2]) == ok


def test_resampled_positions_move_with_the_rows_and_skip_undefined_draws():
    rng = np.random.default_rng(0)
    y = (np.arange(12) < 2).astype(np.int64)  # AUC is undefined on draws without a positive.
    names = [BASELINE_ENTRY, "ensemble_top0", "prior", *(f"s{k}" for k in range(5))]
    preds = [rng.uniform(size=12) for _ in names]
    auc = lambda yt, p: float(sk_metrics.roc_auc_score(yt, p))
    pos = board_checks.resampled_positions(
        names, preds, y, sample="prior", score=auc, direction="higher", rule="mid_rank",
        resamples=200,
    )  # fmt: skip
    assert 0 < len(pos) < 200  # ~ (10/12)^12 = 11% of draws hold no positive row.
    assert len(np.unique(pos[:, 1])) > 3 and np.all((pos >= 0) & (pos <= 1))


def test_noise_refits_the_built_board(builtin_suite):
    (check,) = board_checks.check_noise(["iris"], resamples=20)
    built = board_checks.check_board(os.path.join(builtin_suite, "iris"))
    # The in-memory refit reproduces the written board's positions exactly.
    assert (check.sample, check.baseline, check.ensemble) == (
        built.sample,
        built.baseline,
        built.ensemble,
    )
    assert check.passed == built.passed
    assert check.task_id == "iris" and check.n_test == 45 and check.resamples == 20
    assert check.baseline_band[0] <= check.baseline_band[1] and 0 <= check.p_all <= 1
    assert check.p_all <= min(check.p_sample, check.p_baseline, check.p_ensemble)
    assert "P(all)" in check.line()
    with pytest.raises(ValueError, match="resamples"):
        board_checks.check_noise(["iris"], resamples=0)


def _noise(task_id: str, passed: bool, p_all: float) -> NoiseCheck:
    return NoiseCheck(
        task_id, 45, 200, 0.0, 0.6, 0.97, passed, (0.5, 0.7), (0.9, 1.0), 1.0, 0.7, 0.6, p_all
    )


def test_shares_markdown():
    per_seed = {
        1: [_noise("iris", False, 0.25), _noise("wine", False, 0.5)],
        0: [_noise("iris", True, 0.75), _noise("wine", False, 0.25)],
    }
    text = board_checks.shares_markdown(per_seed, command="cmd --x")
    lines = text.splitlines()
    assert lines[2] == "| 0 | 1 / 2 | 0.50 | 0.50 | wine |"  # A share, not a verdict.
    assert lines[3] == "| 1 | 0 / 2 | 0.00 | 0.38 | iris, wine |"
    assert "| iris | train | 0.75 | 0.25 ✗ |" in lines
    assert "| wine | held-out | 0.25 ✗ | 0.50 ✗ |" in lines
    assert "share of 200 resamples" in text and "`cmd --x`" in text
    assert "exits 1 only on a structural failure" in text
