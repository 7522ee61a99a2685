"""TextAgent on the tiny committed Qwen3 checkpoint: batch layout, log-probs, generation, WM."""

from __future__ import annotations

import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.agents.conftest import FIXTURE, STOPS, M, P, text_agent, text_task
from tests.models.conftest import load
from wmrl_jax import models
from wmrl_jax.agents.base import Rollout, WMOutput
from wmrl_jax.agents.programs import extract_program
from wmrl_jax.agents.text.agent import TextAgent
from wmrl_jax.models.sampler import SampleOutput, _sample


@pytest.fixture(scope="module")
def rolled():
    model, agent = text_agent()
    tasks = [text_task("a"), text_task("b", description="Classify rows; metric accuracy.")]
    ro = agent.rollout(model.params, tasks, group_size=2, key=jax.random.key(3))
    return model, agent, tasks, ro


def test_rollout_batch_layout(rolled):
    model, agent, tasks, ro = rolled
    b = ro.batch
    assert set(b) == {"tokens", "attention_mask", "loss_mask", "old_logprobs"}
    for v in b.values():
        assert v.shape == (4, P + M)
    assert b["tokens"].dtype == np.int32 and b["attention_mask"].dtype == np.int32
    assert b["loss_mask"].dtype == np.float32 and b["old_logprobs"].dtype == np.float32
    prompt_tokens = 0
    for i in range(4):
        prompt = agent.solver_prompt_ids(tasks[i // 2])  # task-major rows
        n = len(prompt)
        prompt_tokens += n
        np.testing.assert_array_equal(b["tokens"][i, P - n : P], prompt)
        np.testing.assert_array_equal(b["attention_mask"][i, :P], [0] * (P - n) + [1] * n)
        assert not b["loss_mask"][i, :P].any() and not b["old_logprobs"][i, :P].any()
        comp, live = b["tokens"][i, P:], b["loss_mask"][i, P:]
        length = int(live.sum())
        assert length >= 1
        np.testing.assert_array_equal(live, [1] * length + [0] * (M - length))
        np.testing.assert_array_equal(b["attention_mask"][i, P:], live)
        # Stops at the first stop token, which is included in the loss.
        assert not set(comp[: length - 1].tolist()) & set(STOPS)
        assert length == M or comp[length - 1] in STOPS
        assert (b["old_logprobs"][i, P : P + length] < 0).all()
        assert not b["old_logprobs"][i, P + length :].any()
        text = model.tokenizer.decode(
            [t for t in comp[:length] if t not in STOPS], skip_special_tokens=True
        )
        assert ro.programs[i] == extract_program(text)
    assert ro.gen_tokens == prompt_tokens + int(b["loss_mask"].sum())


def test_old_logprobs_match_teacher_forcing(rolled):
    model, _, _, ro = rolled
    b = ro.batch
    logits = models.apply(
        model.graphdef, model.params, jnp.asarray(b["tokens"]), jnp.asarray(b["attention_mask"])
    )
    forced = np.asarray(models.token_logprobs(logits[:, :-1], jnp.asarray(b["tokens"][:, 1:])))
    on = b["loss_mask"][:, 1:] > 0
    np.testing.assert_allclose(forced[on], b["old_logprobs"][:, 1:][on], atol=1e-4)


def test_second_rollout_does_not_recompile(rolled):
    model, agent, tasks, _ = rolled
    before = _sample._cache_size()
    ro = agent.rollout(model.params, tasks, group_size=2, key=jax.random.key(4))
    assert _sample._cache_size() == before
    assert ro.batch["tokens"].shape == (4, P + M)


def test_batch_size_chunks_keep_rows_and_shapes():
    model, agent = text_agent(batch_size=3)
    tasks = [text_task("a"), text_task("b")]
    ro = agent.rollout(model.params, tasks, group_size=2, key=jax.random.key(5))
    assert ro.batch["tokens"].shape == (4, P + M) and len(ro.programs) == 4
    before = _sample._cache_size()
    agent.rollout(model.params, tasks[:1], group_size=2, key=jax.random.key(6))  # 2 rows < 3
    assert _sample._cache_size() == before


def test_greedy_programs_deterministic(rolled):
    model, agent, tasks, _ = rolled
    first = agent.greedy_programs(model.params, tasks)
    assert len(first) == 2 and first == agent.greedy_programs(model.params, tasks)
    assert agent.greedy_programs(model.params, []) == []


def test_predict_on_gibberish_is_unusable():
    model, agent = text_agent(stop_ids=(2,))
    tasks = [text_task("a")]
    ro = agent.rollout(model.params, tasks, group_size=2, key=jax.random.key(7))
    # Rows with a program (random weights seldom write one) are what the WM is asked about.
    ro = ro._replace(programs=["print(1)", "x = 2"], causes=("ok", "ok"))
    out = agent.predict(model.params, tasks, ro, key=jax.random.key(8))
    assert isinstance(out, WMOutput)
    assert out.mean.shape == (2,) and out.mean.dtype == np.float32
    assert np.isnan(out.mean).all() and np.isinf(out.var).all()
    assert out.parse_failures == 2 and agent.last_answer_failures == 2 * 2
    prompt = sum(len(agent.wm_prompt_ids(tasks[0], p)) for p in ro.programs) * 2
    assert prompt < out.wm_tokens <= prompt + 2 * 2 * 8


def _stub(answers, calls):
    """A sampler returning `answers[row]` as the generated text of each row."""
    tok = load(FIXTURE).tokenizer

    def sample_fn(model, ids, mask, key, *, max_new_tokens, **kw):
        calls.append((np.asarray(ids).shape, kw))
        rows = [tok(a, add_special_tokens=False)["input_ids"] + [2] for a in answers]
        width = max(max_new_tokens, *map(len, rows))
        tokens = np.zeros((len(rows), width), np.int32)
        live = np.zeros((len(rows), width), np.int32)
        for i, r in enumerate(rows):
            tokens[i, : len(r)], live[i, : len(r)] = r, 1
        return SampleOutput(tokens, np.where(live, -1.0, 0.0), live, live.sum(1))

    return sample_fn


def test_predict_parses_stubbed_answers():
    ans = lambda p, q: "Reasoning. " + json.dumps({"valid_probability": p, "percentile": q})
    answers = [ans(1, 0.6), ans(1, 0.8), "no json here", ans(0.5, 1.0)]
    calls = []
    model, agent = text_agent(sample_fn=_stub(answers, calls), invalid_reward=0.0, stop_ids=(2,))
    ro = Rollout(["print(1)", "print(2)"], {}, 0)
    out = agent.predict(model.params, [text_task("a")], ro, key=jax.random.key(0))
    # Row 0: mean of 0.6 and 0.8, variance 0 + sample variance 0.02 (law of total variance).
    # Row 1: one usable answer, p = 0.5, q = 1: mean 0.5, variance p (1 - p) q^2 = 0.25.
    np.testing.assert_allclose(out.mean, [0.7, 0.5], atol=1e-6)
    np.testing.assert_allclose(out.var, [0.02, 0.25], atol=1e-6)
    assert out.parse_failures == 0 and agent.last_answer_failures == 1
    assert calls[0][0] == (4, agent.wm_max_prompt_tokens)
    assert calls[0][1]["temperature"] == 1.0 and calls[0][1]["eos_ids"] == (2,)


def test_world_model_calls_are_cut_by_wm_batch_size():
    tok = load(FIXTURE).tokenizer
    answer = tok('{"valid_probability": 1, "percentile": 0.5}', add_special_tokens=False)
    calls = []

    def sample_fn(model, ids, mask, key, *, max_new_tokens, **kw):
        calls.append(np.asarray(ids).shape[0])
        row = answer["input_ids"] + [2]
        tokens = np.zeros((len(ids), max(max_new_tokens, len(row))), np.int32)
        tokens[:, : len(row)] = row
        live = (tokens != 0).astype(np.int32)
        return SampleOutput(tokens, np.where(live, -1.0, 0.0), live, live.sum(1))

    # The rollout's batch size is unset (one call); the world model's is 2 rows a call.
    model, agent = text_agent(sample_fn=sample_fn, stop_ids=(2,), wm_batch_size=2)
    ro = Rollout(["print(1)", "print(2)", "print(3)"], {}, 0)
    out = agent.predict(model.params, [text_task("a")], ro, key=jax.random.key(0))
    assert calls == [2, 2, 2]  # 3 programs x K = 2 answers, in calls of 2 rows
    np.testing.assert_allclose(out.mean, [0.5] * 3, atol=1e-6)
    calls.clear()
    agent.rollout(model.params, [text_task("a")], group_size=3, key=jax.random.key(1))
    assert calls == [3]


def test_rollout_rows_without_a_program_carry_their_cause():
    texts = ["```python\nprint(1)\n```", "I cannot.", "```py\nx = (\n```", ""]
    model, agent = text_agent(sample_fn=_stub(texts, []), stop_ids=(2,))
    ro = agent.rollout(
        model.params, [text_task("a"), text_task("b")], group_size=2, key=jax.random.key(0)
    )
    assert ro.programs == ["print(1)\n", "", "", ""]
    assert ro.causes == ("ok", "no_code", "syntax_error", "empty")
    assert agent.describe(ro) == [
        "print(1)",
        "<no program: no_code>",
        "<no program: syntax_error>",
        "<no program: empty>",
    ]


def test_predict_asks_nothing_about_rows_without_a_program():
    ans = lambda p, q: json.dumps({"valid_probability": p, "percentile": q})
    # K = 2 answers per asked row (rows 0 and 2), then what the two padded rows get.
    answers = [ans(1, 0.6), '{"valid_probability": 0.5, "percentile": 0.', ans(1.5, 0.2), "?"]
    calls = []
    model, agent = text_agent(sample_fn=_stub(answers + ["pad"] * 2, calls), stop_ids=(2,))
    agent.invalid_reward = 0.0
    ro = Rollout(["print(1)", "", "print(3)"], {}, 0, ("ok", "no_code", "ok"))
    out = agent.predict(model.params, [text_task("a")], ro, key=jax.random.key(0))
    assert calls[0][0] == (3 * 2, agent.wm_max_prompt_tokens)  # one shape for N * K rows
    np.testing.assert_allclose(out.mean, [0.6, np.nan, 0.2], atol=1e-6)
    assert out.var[1] == np.inf and np.isfinite(out.var[[0, 2]]).all()
    assert out.parse_failures == 0 and agent.last_answer_failures == 2
    assert out.parse_causes == {"no_json": 1, "truncated": 1, "missing_keys": 0, "bad_value": 0}
    assert out.clamped == 1
    asked = sum(len(agent.wm_prompt_ids(text_task("a"), p)) for p in ("print(1)", "print(3)")) * 2
    assert asked < out.wm_tokens < asked + 4 * 30  # the padded rows are not counted
    none = Rollout(["", ""], {}, 0, ("empty", "no_code"))
    out = agent.predict(model.params, [text_task("a")], none, key=jax.random.key(0))
    assert np.isnan(out.mean).all() and out.wm_tokens == 0 and len(calls) == 1


def test_errors():
    model = load(FIXTURE)
    base = dict(max_prompt_tokens=P, max_new_tokens=M, wm_max_new_tokens=4, wm_samples=1)
    base.update(temperature=1.0, top_p=1.0, top_k=0)
    for bad in (dict(max_new_tokens=0), dict(wm_samples=0), dict(temperature=0.0)):
        with pytest.raises(ValueError):
            TextAgent(model.graphdef, model.tokenizer, **{**base, **bad})
    agent = TextAgent(model.graphdef, model.tokenizer, **base)
    with pytest.raises(ValueError, match="group_size"):
        agent.rollout(model.params, [text_task()], group_size=0, key=jax.random.key(0))
    with pytest.raises(ValueError, match="wm_max_prompt_tokens=32"):
        TextAgent(model.graphdef, model.tokenizer, **base, wm_max_prompt_tokens=32).wm_prompt_ids(
            text_task(), "print(1)"
        )
    agent.observe(text_task(), "print(1)", types.SimpleNamespace(status="ok", percentile=0.5))
    assert agent.anchors(text_task()) == []  # anchors_per_task=0 keeps none
    ro = Rollout(["a", "b", "c"], {}, 0)
    with pytest.raises(ValueError, match="do not split"):
        agent.predict(model.params, [text_task("a"), text_task("b")], ro, key=jax.random.key(0))
