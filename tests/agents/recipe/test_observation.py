"""Task observations with signal: the landmark probes, and held-out tasks held out."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from sklearn.model_selection import StratifiedKFold

from wmrl_jax.agents.recipe import landmarks
from wmrl_jax.agents.recipe import vocab as rv
from wmrl_jax.envs import suite
from wmrl_jax.envs.task import load_task


def _nn1_reference(x, y):
    """Normalised balanced accuracy of brute-force 1-NN (numpy, float64) on the same
    subsample and folds as `landmarks`."""
    rows = np.random.default_rng(0).permutation(len(y))[: landmarks.SUBSAMPLE]
    x, y = x[rows], y[rows]
    x = (x - x.mean(0)) / x.std(0)
    pred = np.zeros_like(y)
    folds = StratifiedKFold(landmarks.FOLDS, shuffle=True, random_state=0).split(x, y)
    for train, test in folds:
        d = ((x[test, None, :] - x[None, train, :]) ** 2).sum(-1)
        pred[test] = y[train][np.argmin(d, axis=1)]
    recall = [np.mean(pred[y == c] == c) for c in np.unique(y)]
    chance = 1 / len(recall)
    return (np.mean(recall) - chance) / (1 - chance)


def test_nn1_matches_a_numpy_reference():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(600, 3)) * [1.0, 5.0, 0.1]
    y = (x[:, 0] + 0.2 * x[:, 2] / 0.1 > 0).astype(np.int64) + (x[:, 1] > 4)
    got = landmarks.landmarks(x, y, classification=True)["nn1"]
    assert got == pytest.approx(_nn1_reference(x, y), abs=1e-12)


def test_probes_see_the_structure():
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(500, 4))
    # One axis-aligned threshold: the stump is perfect.
    axis = landmarks.landmarks(x, (x[:, 1] > 0.3).astype(int), classification=True)
    assert axis["stump"] > 0.95
    # XOR of two features: only the local probe sees it.
    xor = landmarks.landmarks(x, (x[:, 0] * x[:, 1] > 0).astype(int), classification=True)
    assert xor["nn1"] > 0.6 and max(xor["stump"], xor["nb"], xor["linear"]) < 0.2
    # A linear regression target: the linear probe is near perfect and best.
    y = x @ [1.0, -2.0, 0.5, 0.0] + 0.01 * rng.normal(size=500)
    lin = landmarks.landmarks(x, y, classification=False)
    assert lin["linear"] > 0.99 and lin["linear"] == max(lin.values())
    assert rv._landmark_features(lin)["best"] == landmarks.PROBES.index("linear")
    # Noise: nothing beats the mean predictor.
    noise = landmarks.landmarks(x, rng.normal(size=500), classification=False)
    assert max(noise.values()) < 0.05


def test_too_few_rows_give_na_tokens():
    x, y = np.arange(8.0)[:, None], np.array([0, 1] * 4)
    scores = landmarks.landmarks(x[:5], y[:5], classification=True)
    assert all(np.isnan(v) for v in scores.values())
    feats = rv._landmark_features(scores)
    assert feats == {**dict.fromkeys(landmarks.PROBES, 0), "best": len(landmarks.PROBES)}
    with pytest.raises(ValueError, match="need x"):
        landmarks.landmarks(x, y[:3], classification=True)


@pytest.fixture(scope="module")
def grown_observations(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("grown"))
    vocab = rv.RecipeVocab()
    out = {}
    for spec in suite.suite_specs("grown"):
        task = load_task(suite.write_task(spec, root, seed=0)[0])
        out[task.id] = (task.split, tuple(rv.task_prompt(vocab, task).tolist()))
    return out


def test_no_held_out_task_shares_its_observation_with_a_training_task(grown_observations):
    seen = collections.defaultdict(list)
    for task_id, (split, prompt) in grown_observations.items():
        if split != "held-out":
            seen[prompt].append(task_id)
    shared = {
        task_id: seen[prompt]
        for task_id, (split, prompt) in grown_observations.items()
        if split == "held-out" and prompt in seen
    }
    assert not shared, f"held-out tasks with a training task's observation: {shared}"
    # The shape tokens alone (the observation before landmarks) do not separate them:
    # 6 of the 12 held-out tasks share their shape with a training task.
    shape = 1 + 7  # BOS and the seven shape groups
    train_shapes = {p[:shape] for s, p in grown_observations.values() if s != "held-out"}
    held = [p[:shape] for s, p in grown_observations.values() if s == "held-out"]
    assert len(held) == 12 and sum(h in train_shapes for h in held) == 6
