"""The GRPO step benchmark's own step (`benchmarks.grpo_step`) on a tiny model, without Tunix.

Timings are not checked; what is checked is that the step it times is a real
GRPO step: full-length completions, group advantages, an on-policy ratio of 1
(sampling log-probs equal the train step's teacher-forced ones) and an update.
"""

import json

import jax
import numpy as np
import pytest

from benchmarks import grpo_step
from benchmarks.forward import make_checkpoint
from wmrl_jax import models

B, K, P, N = 2, 3, 6, 5


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint("tiny", str(tmp_path_factory.mktemp("tiny")))


def test_grpo_batch_layout_and_advantages():
    prompts = np.arange(B * P, dtype=np.int32).reshape(B, P) + 3
    rows = B * K
    out = models.SampleOutput(
        tokens=np.full((rows, N), 7, np.int32),
        logprobs=np.full((rows, N), -2.0, np.float32),
        mask=np.ones((rows, N), np.int32),
        lengths=np.full((rows,), N, np.int32),
    )
    rewards = np.array([0.0, 1.0, 2.0, 5.0, 5.0, 5.0], np.float32)
    batch = grpo_step.grpo_batch(prompts, out, rewards)
    np.testing.assert_array_equal(batch["tokens"][:, :P], np.repeat(prompts, K, axis=0))
    np.testing.assert_array_equal(batch["loss_mask"].sum(axis=1), np.full(rows, N))
    assert batch["loss_mask"][:, :P].sum() == 0 and batch["old_logprobs"][:, :P].sum() == 0
    # Group 0: (r - mean) / (population std + 1e-6); group 1 has equal rewards: exact zeros.
    r = rewards[:K]
    want = (r - r.mean()) / (r.std() + 1e-6)
    np.testing.assert_allclose(batch["advantages"][:K], want, rtol=1e-5)
    np.testing.assert_array_equal(batch["advantages"][K:], 0.0)
    with pytest.raises(ValueError, match="rewards"):
        grpo_step.grpo_batch(prompts, out, rewards[:-1])


def test_ours_step_samples_full_length_and_updates_on_policy(checkpoint):
    prompts = np.random.default_rng(0).integers(3, 300, size=(B, P)).astype(np.int32)
    step = grpo_step.OursStep(
        checkpoint, prompts, samples=K, new=N, kl_coef=0.04, lr=1e-3, compile_ahead=True
    )
    before = jax.tree_util.tree_map(np.asarray, step.state.params)
    metrics = step()
    assert int(step.state.step) == 1
    # Every completion is N tokens long (no stop token); column 0 never counts.
    assert metrics["tokens"] == B * K * N
    # First epoch on-policy: the sampler's log-probs are the train forward's.
    np.testing.assert_allclose([metrics["ratio_min"], metrics["ratio_max"]], 1.0, atol=1e-4)
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-6)  # the reference is the start policy
    after = jax.tree_util.tree_map(np.asarray, step.state.params)
    assert any(
        not np.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True)
    )
    step()  # a second step: the policy moved away from the reference
    assert int(step.state.step) == 2 and step.metrics["kl"] > 0
    assert step.train_step.trace_count == 1  # the second step did not recompile


def test_round_trip_prompts():
    from wmrl_jax.models.fixtures import build_tokenizer

    tokenizer = build_tokenizer()
    rows = grpo_step.round_trip_prompts(tokenizer, np.random.default_rng(1), count=3, length=16)
    assert rows.shape == (3, 16)
    for row in rows:
        assert tokenizer.encode(tokenizer.decode(row), add_special_tokens=False) == row.tolist()


def test_benchmark_runs_without_tunix(tmp_path):
    out = tmp_path / "grpo_step.json"
    shapes = ["--prompts", str(B), "--samples", str(K), "--prompt", str(P), "--new", str(N)]
    payload = grpo_step.main(
        ["--skip", "tunix", "--trials", "1", "--rounds", "2", *shapes, "--json", str(out)]
    )
    assert payload["ours"]["first_s"] > 0 and payload["ours"]["steady_s"] > 0
    assert "tunix" not in payload and payload["trials"][0]["tunix_note"] == "skipped"
    assert json.loads(out.read_text())["ours"] == payload["ours"]
