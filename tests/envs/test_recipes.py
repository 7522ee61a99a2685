"""Recipe space: index round trip, descriptions, compiled programs, error paths."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import io
import itertools
import os
import sys
import warnings

import numpy as np
import pytest
from sklearn import linear_model
from sklearn import metrics as sk_metrics

from wmrl_jax.envs import recipes, suite
from wmrl_jax.envs.recipes import Recipe
from wmrl_jax.envs.task import load_task
from wmrl_jax.sandbox import LocalExecutor, WeakIsolationWarning
from wmrl_jax.sandbox.local import _world_executable

# Small tasks of each submission kind: probabilities, a class index, a value.
SUITE_TASKS = ("iris", "moons_high_noise", "sine_smooth")


def shared_suite(tmp_path_factory) -> str:
    """The seed-0 data of `SUITE_TASKS`, written once per test session (and worker).

    Only the data is generated (the real boards take minutes to fit); each task
    gets a small hand-written board, since these tests compare scores, not ranks.
    """
    root = tmp_path_factory.getbasetemp() / "recipe_suite"
    for task_id in SUITE_TASKS:
        if not (root / task_id / "manifest.json").exists():
            suite.write_task(suite.spec_by_id(task_id), os.fspath(root), seed=0)
            board = root / task_id / "private" / "leaderboards" / "private.csv"
            board.write_text("entry,score\na,0.0\nb,0.5\nc,1.0\nd,2.0\n")
    return os.fspath(root)


def local_executor(**kwargs) -> LocalExecutor:
    """A LocalExecutor on this interpreter (which has numpy and scikit-learn).

    As root, programs run under a uid of their own, which cannot execute an
    interpreter inside a private home directory; then these trusted test
    programs run as the caller instead.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", WeakIsolationWarning)
        executor = LocalExecutor(python=sys.executable, **kwargs)
    if executor.switch_user and not _world_executable(sys.executable):
        executor.switch_user = False
    return executor


@pytest.fixture(scope="session")
def suite_dir(tmp_path_factory) -> str:
    return shared_suite(tmp_path_factory)


def test_space_size():
    assert recipes.SLOT_SIZES == (4, 8, 3, 3)
    assert recipes.NUM_RECIPES == 4 * 8 * 3 * 3 == 288
    assert len(recipes.SLOTS) == len(recipes.SLOT_SIZES)


def test_index_round_trip_over_the_whole_space():
    seen = set()
    for i in range(recipes.NUM_RECIPES):
        r = recipes.recipe_from_index(i)
        assert recipes.recipe_index(r) == i
        seen.add(r)
    assert seen == {Recipe(*v) for v in itertools.product(*map(range, recipes.SLOT_SIZES))}
    # Row-major: the last slot varies fastest.
    assert recipes.recipe_from_index(1) == Recipe(0, 0, 0, 1)
    assert recipes.recipe_from_index(3) == Recipe(0, 0, 1, 0)
    assert recipes.recipe_index(Recipe(1, 0, 0, 0)) == 72


@pytest.mark.parametrize("i", [-1, recipes.NUM_RECIPES])
def test_index_out_of_range(i):
    with pytest.raises(ValueError, match="recipe index"):
        recipes.recipe_from_index(i)


@pytest.mark.parametrize("r", [Recipe(4, 0, 0, 0), Recipe(0, 8, 0, 0), Recipe(0, 0, 3, 0)])
def test_recipe_out_of_range(r):
    with pytest.raises(ValueError, match="outside the slot sizes"):
        recipes.recipe_index(r)
    with pytest.raises(ValueError, match="outside the slot sizes"):
        recipes.describe(r)


def test_describe():
    assert (
        recipes.describe(Recipe(1, 5, 2, 0))
        == "standard/forest/a=2/b=0 (n_estimators=200, max_depth=4)"
    )
    # Classification and regression levels differ: both shown, "cls|reg".
    assert (
        recipes.describe(Recipe(0, 2, 0, 1)) == "none/linear/a=0/b=1 (C=0.01|100.0, fraction=0.3)"
    )


def test_programs_are_deterministic_distinct_and_self_contained(suite_dir):
    task = load_task(os.path.join(suite_dir, "iris"))
    sources = [
        recipes.compile_program(recipes.recipe_from_index(i), task)
        for i in range(recipes.NUM_RECIPES)
    ]
    assert len(set(sources)) == recipes.NUM_RECIPES
    assert sources[17] == recipes.compile_program(recipes.recipe_from_index(17), task)
    allowed = {"csv", "os", "warnings", "numpy", "sklearn"}
    for source in sources:
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert {a.name.split(".")[0] for a in node.names} <= allowed
            elif isinstance(node, ast.ImportFrom):
                assert node.module.split(".")[0] in allowed
        assert 'SEED = int(os.environ.get("WMRL_REPLICATE", "0"))' in source
        assert "random_state=0" not in source  # Every seed is the replicate's.


def test_program_format_follows_the_task(suite_dir):
    r = Recipe(1, 2, 1, 2)
    iris = recipes.compile_program(r, load_task(os.path.join(suite_dir, "iris")))
    assert 'writer.writerow(["id", "p_0", "p_1", "p_2"])' in iris
    assert "HEDGE" in iris
    moons = recipes.compile_program(r, load_task(os.path.join(suite_dir, "moons_high_noise")))
    assert 'writer.writerow(["id", "p_0", "p_1"])' in moons
    # An accuracy task (none in the suite today) writes class indices.
    task = load_task(os.path.join(suite_dir, "moons_high_noise"))
    accuracy = dataclasses.replace(
        task,
        metric=dataclasses.replace(task.metric, name="accuracy", direction="higher"),
        submission=dataclasses.replace(task.submission, target_columns=("target",)),
    )
    assert "np.argmax(proba, axis=1)" in recipes.compile_program(r, accuracy)
    sine = recipes.compile_program(r, load_task(os.path.join(suite_dir, "sine_smooth")))
    assert "Ridge(alpha=1.0)" in sine and "proba" not in sine


def test_program_runs_in_process_with_a_class_missing_from_the_subsample(tmp_path, suite_dir):
    # iris with 10% of its rows and one class removed from train: the absent class
    # still gets a (hedged, small) probability column.
    src = os.path.join(suite_dir, "iris")
    task = load_task(src)
    public = tmp_path / "public"
    public.mkdir()
    with open(os.path.join(task.public_dir, "train.csv")) as f:
        lines = f.read().splitlines()
    kept = [ln for ln in lines[1:] if not ln.endswith(",2")]
    (public / "train.csv").write_text("\n".join([lines[0], *kept]) + "\n")
    with open(os.path.join(task.public_dir, "test.csv")) as f:
        (public / "test.csv").write_text(f.read())
    source = recipes.compile_program(Recipe(1, 2, 1, 0), task)  # linear, fraction 0.1
    out = tmp_path / "out"
    out.mkdir()
    env = {"WMRL_INPUT_DIR": os.fspath(public), "WMRL_OUTPUT_DIR": os.fspath(out)}
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        exec(compile(source, "main.py", "exec"), {"__name__": "__main__"})
    finally:
        os.environ.clear()
        os.environ.update(saved)
    rows = (out / "submission.csv").read_text().splitlines()
    assert rows[0] == "id,p_0,p_1,p_2"
    proba = np.array([[float(v) for v in row.split(",")[1:]] for row in rows[1:]])
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(proba[:, 2], recipes.HEDGE / 3, rtol=1e-12)


def _run(source: str, input_dir: str, out, replicate: int | None) -> str:
    """Executes `source` in this process as an executor would; returns what it printed."""
    env = {"WMRL_INPUT_DIR": input_dir, "WMRL_OUTPUT_DIR": os.fspath(out)}
    if replicate is not None:
        env[recipes.REPLICATE_ENV] = str(replicate)
    saved, printed = dict(os.environ), io.StringIO()
    os.environ.pop(recipes.REPLICATE_ENV, None)
    os.environ.update(env)
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(source, "main.py", "exec"), {"__name__": "__main__"})
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return printed.getvalue()


def test_replicate_seeds_the_validation_split_and_the_model(tmp_path, suite_dir):
    task = load_task(os.path.join(suite_dir, "iris"))
    source = recipes.compile_program(Recipe(0, 2, 1, 2), task)  # raw linear, C=1, all rows
    header, *rows = np.loadtxt(
        os.path.join(task.public_dir, "train.csv"), delimiter=",", dtype=str
    ).tolist()
    x, y = np.array([r[1:-1] for r in rows], float), np.array([r[-1] for r in rows], float)
    x_test = np.loadtxt(os.path.join(task.public_dir, "test.csv"), delimiter=",", skiprows=1)
    subs = {}
    for replicate in (None, 0, 1, 2, 1):
        out = tmp_path / f"out{replicate}-{len(subs)}"
        out.mkdir()
        printed = _run(source, task.public_dir, out, replicate)
        subs.setdefault(replicate, []).append((out / "submission.csv").read_bytes())
        # The reference: the same split and model, written independently with scikit-learn.
        order = np.random.default_rng(replicate or 0).permutation(len(y))
        n_valid = int(round(recipes.VALIDATION * len(y)))
        fit, valid = np.sort(order[n_valid:]), order[:n_valid]
        model = linear_model.LogisticRegression(C=1.0, max_iter=1000).fit(x[fit], y[fit])
        hedge = lambda p: (1 - recipes.HEDGE) * p + recipes.HEDGE / 3
        want = sk_metrics.log_loss(y[valid], hedge(model.predict_proba(x[valid])), labels=[0, 1, 2])
        assert printed == f"validation log_loss: {want:.6f} on {n_valid} held-out rows\n"
        got = np.loadtxt(out / "submission.csv", delimiter=",", skiprows=1)[:, 1:]
        np.testing.assert_allclose(got, hedge(model.predict_proba(x_test[:, 1:])), rtol=1e-9)
    assert subs[None] == subs[0]  # Unset means replicate 0.
    assert subs[1][0] == subs[1][1]  # The same replicate, the same file.
    assert len({subs[0][0], subs[1][0], subs[2][0]}) == 3


def test_grader_metric_is_refused(make_task, monkeypatch):
    from tests.envs.conftest import base_manifest
    from wmrl_jax.envs.task import GRADER_MODULES_ENV

    monkeypatch.setenv(GRADER_MODULES_ENV, "pkg")
    manifest = base_manifest(metric={"grader": "pkg.mod:fn", "direction": "higher"})
    task = load_task(make_task(manifest=manifest))
    with pytest.raises(ValueError, match="toy.*named metric"):
        recipes.compile_program(Recipe(0, 0, 0, 0), task)
