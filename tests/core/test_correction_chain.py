"""The reward correction as a chain: bit-identical to the recorded behaviour, piece by piece."""

import numpy as np
import pytest

from tests.core.fixtures import correction_replay
from wmrl_jax.core import correction as correction_lib
from wmrl_jax.core import correction_pieces as pieces
from wmrl_jax.core.correction import make_reward_correction


@pytest.fixture(scope="module")
def replayed():
    return correction_replay.record(make_reward_correction)


@pytest.mark.parametrize("name", list(correction_replay.CONFIGS))
def test_replay_is_bit_identical_to_the_recorded_correction(replayed, name):
    recorded = np.load(correction_replay.PATH)
    keys = sorted(k for k in recorded.files if k.startswith(f"{name}/"))
    assert keys == sorted(k for k in replayed if k.startswith(f"{name}/"))
    for key in keys:
        np.testing.assert_array_equal(replayed[key], recorded[key], err_msg=key, strict=True)


def _rows(pred, real, executed, **kw):
    pred = np.asarray(pred, np.float32)
    execution = np.where(executed, np.asarray(real, np.float32), np.nan).astype(np.float32)
    has_real = np.asarray(executed) & np.isfinite(execution)
    usable = np.isfinite(pred)
    n = len(pred)
    fields = dict(
        pred=pred, pred_var=np.ones(n, np.float32), execution=execution, has_real=has_real,
        usable=usable, anchors=has_real & usable, replicate=None, known_real=None,
        known_count=None, task=np.zeros(n, np.int32), feat=np.zeros((n, 1), np.int32),
        weight=np.ones(n, np.float32), wm_prior=pred, wm_unseen=pred, wm=pred,
    )  # fmt: skip
    fields.update(kw)
    return pieces.Rows(**fields)


def test_replicates_average_pairs_and_shrink_sigma2_real_to_the_prior():
    piece = pieces.replicates(prior=0.5, prior_count=2.0)
    rows = _rows([0.1, 0.2], [0.4, 0.6], [True, True], replicate=np.array([0.6, np.nan]))
    rows, state = piece.update(piece.init(), rows)
    np.testing.assert_allclose(rows.real, [0.5, 0.6], rtol=1e-6)  # the pair's mean
    # One pair: (0.4 - 0.6)^2 / 2 = 0.02; shrunk: (0.02 + 2 x 0.5) / (1 + 2) = 0.34.
    np.testing.assert_allclose(float(rows.sigma2_real), 0.34, rtol=1e-6)
    np.testing.assert_allclose(rows.var_real, [0.17, 0.34], rtol=1e-6)  # 2 and 1 executions
    assert float(state.replicate_count) == 1.0


def test_anchor_memory_adds_remembered_means_of_rows_not_executed():
    piece = pieces.anchor_memory()
    known, count = np.array([0.7, 0.5, np.nan]), np.array([3.0, 4.0, 0.0])
    rows = _rows([0.1, 0.2, 0.3], [0.9, 0.0, 0.0], [True, False, False],
                 known_real=known, known_count=count)  # fmt: skip
    rows = rows._replace(real=rows.execution, var_real=np.full(3, 0.1), sigma2_real=0.1)
    rows, _ = piece.update(piece.init(), rows)
    np.testing.assert_array_equal(rows.has_real_any, [True, True, False])
    np.testing.assert_allclose(rows.real_any[:2], [0.9, 0.5])  # executed now wins
    np.testing.assert_allclose(rows.var_real_any[:2], [0.1, 0.025])  # σ²_real / 4


def test_fed_reward_pieces_on_one_row_of_each_kind():
    # Rows: executed with a prediction, prediction only, executed without one, neither.
    pred = np.array([0.2, 0.4, np.nan, np.nan], np.float32)
    rows = _rows(pred, [0.8, 0.0, 0.6, 0.0], [True, False, True, False])
    rows = rows._replace(
        real_any=rows.execution, var_real_any=np.full(4, 0.01, np.float32),
        has_real_any=rows.has_real, var_wm=np.where(rows.usable, 0.03, np.inf), fallback=0.5,
    )  # fmt: skip
    fused, _ = pieces.inverse_variance_fusion().update(pieces.EmptyState(), rows)
    # (0.2 / 0.03 + 0.8 / 0.01) / (1 / 0.03 + 1 / 0.01) = 0.65.
    np.testing.assert_allclose(fused.rewards, [0.65, 0.4, 0.6, 0.5], rtol=1e-6)
    np.testing.assert_allclose(fused.weight_wm, [0.25, 1.0, 0.0, 0.0], rtol=1e-6)
    replaced, _ = pieces.real_replaces_wm().update(pieces.EmptyState(), rows)
    np.testing.assert_allclose(replaced.rewards, [0.8, 0.4, 0.6, 0.5], rtol=1e-6)
    wm, _ = pieces.wm_only().update(pieces.EmptyState(), rows)
    np.testing.assert_allclose(wm.rewards, [0.2, 0.4, 0.5, 0.5], rtol=1e-6)


def test_per_sample_variance_scales_by_the_wm_own_variance():
    rows = _rows([0.1, 0.2, np.nan], [0, 0, 0], [False] * 3)
    rows = rows._replace(pred_var=np.array([0.02, 0.0, 0.05], np.float32), sigma2_wm=0.3,
                         pred_var_mean=0.01)  # fmt: skip
    rows, _ = pieces.per_sample_variance(min_wm_var=1e-3).update(pieces.EmptyState(), rows)
    np.testing.assert_allclose(rows.var_wm, [0.6, 1e-3, np.inf], rtol=1e-6)  # floored; unusable


def test_wm_variance_counts_only_residuals_the_map_had_not_seen():
    piece = pieces.wm_variance(var_decay=1.0, min_wm_var=1e-6)
    rows = _rows([0.0, 0.0, 0.0], [0.1, -0.1, 5.0], [True, True, False], sigma2_real=0.001)
    rows, state = piece.update(piece.init(), rows)
    # The two anchors' residuals ±0.1 (the unexecuted row's is never read): unbiased
    # variance 2 x 0.01 / (2 - 1) = 0.02, minus σ²_real.
    np.testing.assert_allclose(float(rows.resid_var), 0.02, rtol=1e-5)
    np.testing.assert_allclose(float(rows.sigma2_wm), 0.019, rtol=1e-4)
    rows, _ = piece.update(state, rows._replace(prior_gate=False))
    np.testing.assert_allclose(float(rows.resid_var), 0.02, rtol=1e-5)  # nothing added


def test_a_chain_must_own_every_state_field_once():
    with pytest.raises(ValueError, match="unowned"):
        correction_lib.chain(pieces.replicates(prior=1.0, prior_count=1.0))
