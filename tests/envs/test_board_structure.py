"""What fails `builtin build`: structural failures of a board, each on a hand-broken board;
a board that only misses a noise check builds (exit 0)."""

import os
import re
import shutil

import numpy as np
import pytest

from wmrl_jax.envs import board_structure, builtin, grading, ladder, suite
from wmrl_jax.envs import task as task_lib
from wmrl_jax.envs.ensembles import BASELINE_ENTRY, NUM_ENSEMBLES
from wmrl_jax.envs.ensembles import ENSEMBLE_PREFIX as ENS


def _board_rows(sample: float, *, baseline: float, n: int) -> list[tuple[str, float]]:
    """A log-loss board (lower is better) of `n` singles, the baseline and the ensembles:
    the sample (the prior) first, singles from 0.9 x its score down to 0.3 x, ensembles
    at 0.2 x, below every single."""
    singles = [("prior", sample)] + [
        (f"single{k}", sample * w) for k, w in enumerate(np.linspace(0.9, 0.3, n - 1))
    ]
    ens = [(f"{ENS}top{k}", sample * (0.2 - 1e-3 * k)) for k in range(NUM_ENSEMBLES)]
    return [*singles, (BASELINE_ENTRY, baseline), *ens]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The real iris task of seed 0 (data, answers, sample submission), without a board."""
    out = tmp_path_factory.mktemp("suite")
    root, _ = suite.write_task(suite.spec_by_id("iris"), str(out), seed=0)
    return root


@pytest.fixture
def iris(built, tmp_path):
    """A copy of the iris task with a sound board; the baseline in its window (at 0.62)."""
    root = str(tmp_path / "iris")
    shutil.copytree(built, root)
    suite.write_leaderboard(root, [("placeholder", 1.0)])  # grading needs a board
    sample = grading.grade(
        task_lib.load_task(root), os.path.join(root, "public", "sample_submission.csv")
    ).score
    n = len(ladder.population(seed=0, classification=True, n_train=100))
    rows = _board_rows(sample, baseline=sample * 0.4, n=n)
    suite.write_leaderboard(root, rows)
    return root, rows, sample


def test_a_sound_board_has_no_structural_problem(iris):
    root, rows, _ = iris
    assert len(rows) == board_structure.promised_entries(classification=True) == 234
    assert board_structure.structural_problems(root) == []


def _break(root, rows, sample, how):
    if how == "no sample file":
        os.remove(os.path.join(root, "public", "sample_submission.csv"))
    elif how == "sample not on the board":
        suite.write_leaderboard(root, [("prior", sample * 1.5), *rows[1:]])
    elif how == "no baseline":
        suite.write_leaderboard(
            root, [r for r in rows if r[0] != BASELINE_ENTRY] + [("extra", sample * 0.4)]
        )
    elif how == "no ensembles":
        suite.write_leaderboard(root, [(n.replace(ENS, "x_"), s) for n, s in rows])
    elif how == "non-finite score":
        suite.write_leaderboard(root, [*rows[:5], ("single_nan", float("nan")), *rows[6:]])
    elif how == "infinite score":
        suite.write_leaderboard(root, [*rows[:5], ("single_inf", float("inf")), *rows[6:]])
    elif how == "too few entries":
        suite.write_leaderboard(root, [*rows[:100], *rows[-NUM_ENSEMBLES - 1 :]])
    elif how == "reversed order":  # scores as if higher were better
        suite.write_leaderboard(root, [(n, 2 * sample - s) for n, s in rows])
    elif how == "answers copied into public":
        shutil.copy(os.path.join(root, "private", "answers.csv"), os.path.join(root, "public"))
    elif how == "answers linked from public":
        os.symlink(
            os.path.join(root, "private", "answers.csv"), os.path.join(root, "public", "y.csv")
        )
    elif how == "answer column in test.csv":
        path = os.path.join(root, "public", "test.csv")
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join([lines[0] + ",target", *(x + ",0" for x in lines[1:])]) + "\n")


BREAKAGES = {
    "no sample file": "lacks the sample submission: no public/sample_submission.csv",
    "sample not on the board": "lacks the sample submission \\(score",
    "no baseline": f"lacks the default baseline '{BASELINE_ENTRY}'",
    "no ensembles": "lacks tuned ensembles",
    "non-finite score": r"non-finite score for 1 entries, e.g. \['single_nan'\]",
    "infinite score": r"non-finite score .*single_inf",
    "too few entries": "holds 161 entries, the ladder promises 234",
    "reversed order": "order disagrees with lower-is-better",
    "answers copied into public": "public file public/answers.csv is a copy of the answers",
    "answers linked from public": "task does not load: .*public/",
    "answer column in test.csv": "public/test.csv carries the answer column 'target'",
}


@pytest.mark.parametrize("how", list(BREAKAGES))
def test_a_structural_failure_fails_the_build(iris, monkeypatch, capsys, how):
    root, rows, sample = iris
    _break(root, rows, sample, how)
    problems = board_structure.structural_problems(root)
    assert len(problems) >= 1 and all("\n" not in p for p in problems), problems
    assert any(re.search(BREAKAGES[how], p) for p in problems), problems
    monkeypatch.setattr(builtin, "build", lambda out, **kw: [root])
    assert builtin.main(["build", "--out", "suite", "--seed", "2"]) == 1
    out = capsys.readouterr().out
    assert "BROKEN iris: " in out and "1 structurally broken: FAIL" in out


@pytest.mark.parametrize("baseline_weight, passes", [(0.4, True), (0.95, False)])
def test_a_noise_miss_builds(iris, monkeypatch, capsys, baseline_weight, passes):
    # 0.95 x the prior's score puts the baseline below the median: a check misses,
    # which on a small test set measures the rows the split drew; the build exits 0.
    root, rows, sample = iris
    suite.write_leaderboard(
        root, [(n, sample * baseline_weight if n == BASELINE_ENTRY else s) for n, s in rows]
    )
    monkeypatch.setattr(builtin, "build", lambda out, **kw: [root])
    assert builtin.main(["build", "--out", "suite", "--seed", "2"]) == 0
    out = capsys.readouterr().out
    assert ("ok   iris" in out) == passes and ("miss iris" in out) == (not passes)
    share = "1.00" if passes else "0.00"
    assert f"{int(passes)} of 1 sound boards pass all three checks (share {share}" in out
    assert "0 structurally broken: ok" in out and "BROKEN" not in out
