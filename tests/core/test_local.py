"""The local correction: the back-off estimator against a float64 reference, in the update."""

import jax
import numpy as np
import pytest

from wmrl_jax.core.correction import make_reward_correction
from wmrl_jax.core.local import local_offsets


def _reference(task, feat, mem_task, mem_feat, resid, weight, kappa, exclude):
    """The module docstring's recursion, row by row, in float64."""
    out, exact = np.zeros(len(task)), np.zeros(len(task))
    for i in range(len(task)):
        delta = 0.0
        for level in range(feat.shape[1], -1, -1):
            num = den = 0.0
            for j in range(len(mem_task)):
                dist = int(np.sum(feat[i] != mem_feat[j]))
                if mem_task[j] == task[i] and dist <= level and j != exclude[i]:
                    num += weight[j] * resid[j]
                    den += weight[j]
            delta = (num + kappa * delta) / (den + kappa)
        out[i], exact[i] = delta, den
    return out, exact


def test_local_offsets_match_the_float64_reference():
    rng = np.random.default_rng(0)
    n, m, f = 12, 40, 3
    task, mem_task = rng.integers(0, 3, n), rng.integers(0, 3, m)
    feat, mem_feat = rng.integers(0, 2, (n, f)), rng.integers(0, 2, (m, f))
    resid = rng.normal(size=m)
    weight = rng.uniform(size=m) * (rng.uniform(size=m) > 0.2)  # some empty slots
    exclude = rng.integers(0, m + 5, n)  # some out of range: exclude nothing
    got = jax.jit(lambda *a: local_offsets(*a[:-1], prior_count=1.5, exclude=a[-1]))(
        task, feat, mem_task, mem_feat, resid, weight, exclude
    )
    want = _reference(task, feat, mem_task, mem_feat, resid, weight, 1.5, exclude)
    np.testing.assert_allclose(np.asarray(got[0]), want[0], atol=1e-5)
    np.testing.assert_allclose(np.asarray(got[1]), want[1], atol=1e-5)


def test_no_neighbours_no_offset_and_one_program_pulls_its_own_residual():
    args = (np.array([5, 1]), np.array([[0], [2]]), np.array([1, 1, 1]),
            np.array([[2], [2], [0]]), np.array([0.4, 0.4, -0.1]), np.ones(3))  # fmt: skip
    delta, exact = local_offsets(*args, prior_count=1.0)
    assert float(delta[0]) == 0.0 and float(exact[0]) == 0.0  # task 5 has no executions
    task_level = (0.4 + 0.4 - 0.1) / (3 + 1)
    assert float(delta[1]) == pytest.approx((0.8 + task_level) / (2 + 1), abs=1e-6)
    assert float(exact[1]) == 2.0


def _blind_spot_errors(local: bool) -> tuple[float, float]:
    """Mean fed-reward error on unexecuted rows, in and out of a persistent blind spot."""
    rng = np.random.default_rng(0)
    c = make_reward_correction(capacity=256, local=local, local_features=2, min_anchors=4)
    update, state = jax.jit(c.update), c.init()
    blind_err, other_err = [], []
    for step in range(60):
        task, feat = rng.integers(0, 2, 16), rng.integers(0, 3, (16, 2))
        q = rng.uniform(size=16)
        blind = (task == 1) & (feat[:, 0] == 0)  # over-rated: one kind of program, one task
        pred = (q + 0.4 * blind + 0.05 * rng.normal(size=16)).astype(np.float32)
        real = (q + 0.05 * rng.normal(size=16)).astype(np.float32)
        anchor = rng.uniform(size=16) < 0.3
        fed, state, diag = update(
            state, pred, np.ones(16), np.where(anchor, real, np.nan), anchor,
            task=task, features=feat,
        )  # fmt: skip
        if step >= 30:
            err = np.asarray(fed) - q
            blind_err += list(err[blind & ~anchor])
            other_err += list(err[~blind & ~anchor])
    assert ("local_abs_offset" in diag) == local
    return float(np.mean(blind_err)), float(np.mean(other_err))


def test_local_correction_removes_a_blind_spot_the_global_map_keeps():
    blind_global, other_global = _blind_spot_errors(local=False)
    blind_local, other_local = _blind_spot_errors(local=True)
    assert blind_global > 0.2  # the isotonic map cannot see (task, program)
    assert blind_local < 0.08
    assert abs(other_local) <= abs(other_global) + 0.01


def test_local_correction_needs_task_ids_and_the_declared_feature_width():
    c = make_reward_correction(capacity=8, local=True, local_features=2)
    args = (c.init(), np.ones(2), np.ones(2), np.ones(2), np.ones(2, bool))
    with pytest.raises(ValueError, match="needs `task`"):
        c.update(*args)
    with pytest.raises(ValueError, match=r"shape \[N, 2\]"):
        c.update(*args, task=np.zeros(2, int), features=np.zeros((2, 3), int))
