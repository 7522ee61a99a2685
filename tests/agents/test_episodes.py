"""Multi-turn episodes: scripted agents through real local-process sandbox calls, the token
layout and masks of the train batch, the budget cut-off, the world model's transcript,
single-turn parity, and a GRPO step on episodes of the tuned tiny text checkpoint."""

from __future__ import annotations

import functools
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.envs.conftest import base_manifest, write_csv
from tests.models.conftest import load
from wmrl_jax import models
from wmrl_jax.agents.programs import find_action
from wmrl_jax.agents.text import default_config, validate_config
from wmrl_jax.agents.text.agent import TextAgent
from wmrl_jax.agents.text.episodes import EnvironmentMessages, sequence_lengths
from wmrl_jax.envs.outcomes import SandboxOutcomes
from wmrl_jax.envs.task import load_task
from wmrl_jax.models.sampler import SampleOutput
from wmrl_jax.sandbox import LocalExecutor
from wmrl_jax.sandbox.tools import ToolBox, write_sample
from wmrl_jax.train import stages

FIXTURE = "qwen3_gqa1_tied"  # 2 layers, width 64, byte-level BPE of 384 tokens
TUNED = os.path.join(os.path.dirname(__file__), "fixtures", "qwen3_text_tuned")
P, M, E = 1024, 512, 256
STOP = 2  # <|im_end|> of the fixture tokenizers
LOGP = -0.5  # the scripted policy's log-prob of every token it writes

PROGRAM = """import csv, os
def rows(name):
    with open(os.path.join(os.environ["WMRL_INPUT_DIR"], name)) as f:
        return list(csv.DictReader(f))
train, test = rows("train.csv"), rows("test.csv")
mean = sum(float(r["target"]) for r in train) / len(train)
with open(os.path.join(os.environ["WMRL_OUTPUT_DIR"], "submission.csv"), "w") as f:
    f.write("id,target\\n" + "".join(f"{r['id']},{mean}\\n" for r in test))
"""
INFO = "I will look at the data first.\nACTION: info"
VALIDATE = f"```python\n{PROGRAM}```\nACTION: validate"
SUBMIT = f"```python\n{PROGRAM}```\nACTION: submit"


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    """A regression task with 40 train and 10 test rows, a leaderboard, real files."""
    root = tmp_path_factory.mktemp("episode_task") / "toy"
    (root / "public").mkdir(parents=True)
    (root / "private" / "leaderboards").mkdir(parents=True)
    (root / "manifest.json").write_text(json.dumps(base_manifest()))
    (root / "description.md").write_text("Predict `target` from f0 and f1 (rmse).\n")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 2)).round(3)
    y = (x @ [1.0, -2.0] + 3.0).round(3)
    write_csv(root / "public" / "train.csv", ["id", "f0", "f1", "target"],
              [(i, *x[i], y[i]) for i in range(10, 50)])  # fmt: skip
    write_csv(root / "public" / "test.csv", ["id", "f0", "f1"], [(i, *x[i]) for i in range(10)])
    write_csv(root / "private" / "answers.csv", ["id", "target"], [(i, y[i]) for i in range(10)])
    write_csv(root / "private" / "leaderboards" / "private.csv", ["entry", "score"],
              [(f"e{i}", s) for i, s in enumerate([0.5, 1.5, 2.5, 3.5])])  # fmt: skip
    return load_task(root)


@pytest.fixture(scope="module")
def executor():
    with pytest.warns(UserWarning):
        ex = LocalExecutor(timeout_s=60, max_workers=4)
    yield ex
    ex.close()


def tools_on(executor, **kw):
    kw = dict(info_timeout_s=30, validate_timeout_s=30, validate_rows=5) | kw
    return ToolBox(executor, close_executor=False, **kw)


def scripted(policy):
    """A sampler whose row writes `policy(prompt text)` (then the stop token)."""

    def sample_fn(model, ids, mask, key, *, max_new_tokens, pad_id, **_):
        tok = model_tokenizer()
        tokens = np.full((len(ids), max_new_tokens), pad_id, np.int32)
        live = np.zeros_like(tokens)
        for r, (row, m) in enumerate(zip(ids, mask, strict=True)):
            out = tok(policy(tok.decode(row[m > 0])), add_special_tokens=False)["input_ids"]
            out = (out + [STOP])[:max_new_tokens]
            tokens[r, : len(out)], live[r, : len(out)] = out, 1
        return SampleOutput(tokens, np.where(live > 0, LOGP, 0.0), live, live.sum(1))

    return sample_fn


@functools.cache
def model_tokenizer():
    return load(FIXTURE).tokenizer


def script(*messages):
    """The policy that writes message k once the prompt holds k - 1 environment answers."""
    return scripted(lambda prompt: messages[min(prompt.count("<|im_start|>user") - 1,
                                                len(messages) - 1)])  # fmt: skip


def agent_with(sample_fn, tools, *, turns=3, **kw):
    model = load(FIXTURE)
    args = dict(max_prompt_tokens=P, max_new_tokens=M, wm_max_new_tokens=96, wm_samples=1,
                temperature=1.0, top_p=1.0, top_k=0, turns=turns, tool_max_tokens=E,
                tools=tools, sample_fn=sample_fn)  # fmt: skip
    return model, TextAgent(model.graphdef, model.tokenizer, **(args | kw))


@pytest.fixture(scope="module")
def episode(task, executor):
    """info -> validate -> submit, two episodes of one task."""
    model, agent = agent_with(script(INFO, VALIDATE, SUBMIT), tools_on(executor))
    return model, agent, agent.rollout(model.params, [task], group_size=2, key=jax.random.key(0))


def test_find_action():
    info = find_action("Look first.\nACTION: info")
    assert (info.name, info.program.cause, info.explicit) == ("info", "no_code", True)
    assert find_action("**Action:** `info`").name == "info"
    a = find_action(f"Here:\n```python\n{PROGRAM}```\n- action: Validate.")
    assert (a.name, a.program.source, a.explicit) == ("validate", PROGRAM, True)
    # The action line is never part of the program, even inside its block.
    b = find_action("```python\nprint(1)\nACTION: submit\n```")
    assert (b.name, b.program.source) == ("submit", "print(1)\n")
    assert find_action("ACTION: info\nthen\nACTION: submit\nprint(2)").name == "submit"
    assert find_action("print(3)") == ("submit", find_action("print(3)").program, False)
    assert find_action("I think a forest would do.").name == "none"
    assert find_action("The action: submit it later, maybe").name == "none"  # not a whole line


def test_scripted_episode_makes_real_tool_calls(episode, task, executor):
    _, _, ro = episode
    assert ro.programs == [PROGRAM, PROGRAM] and ro.causes == ("ok", "ok")
    assert ro.tool_calls == 4 and ro.tool_seconds > 0 and ro.tool_wait_seconds > 0
    for transcript in ro.transcripts:
        # The info program ran on the public data: 40 train rows, the real columns.
        assert "[info result]" in transcript and "train.csv: 40 rows, 4 columns" in transcript
        assert "f1: numeric, 0 missing" in transcript
        # Validation ran the agent's program on 5-row samples and checked its submission.
        assert "> [validate result]\n> status: ok" in transcript  # quoted lines
        assert "5 of the sample's 5 test ids present" in transcript
        assert SUBMIT not in transcript  # the transcript stops before the submission
    # The submission itself is graded for real (what an anchor's execution does).
    outcome = SandboxOutcomes(executor, close_executor=False).submit(task, ro.programs[0])
    outcome = outcome.result()
    assert outcome.status == "ok" and 0 <= outcome.percentile <= 1 and outcome.seconds > 0


def _runs(flags: np.ndarray) -> list[tuple[int, int]]:
    edges = np.flatnonzero(np.diff(np.concatenate([[0], flags.astype(int), [0]])))
    return list(zip(edges[::2], edges[1::2], strict=True))


def test_environment_tokens_are_masked(episode, task):
    model, agent, ro = episode
    b, tok = ro.batch, model.tokenizer
    t = P + 3 * M + 2 * E
    assert all(v.shape == (2, t) for v in b.values())
    prompt = agent.solver_prompt_ids(task)
    for i in range(2):
        ids, att, loss = b["tokens"][i], b["attention_mask"][i], b["loss_mask"][i]
        np.testing.assert_array_equal(ids[P - len(prompt) : P], prompt)
        assert not att[: P - len(prompt)].any() and not loss[:P].any()
        # Three runs of the agent's own tokens, each its message and stop token ...
        agent_runs = _runs(loss > 0)
        for (s, e), text in zip(agent_runs, (INFO, VALIDATE, SUBMIT), strict=True):
            want = tok(text, add_special_tokens=False)["input_ids"] + [STOP]
            np.testing.assert_array_equal(ids[s:e], want)
            np.testing.assert_array_equal(b["old_logprobs"][i, s:e], LOGP)
        # ... and between them the environment's answers: attended, never trained on.
        env_runs = _runs((att > 0) & (loss == 0) & (np.arange(t) >= P))
        assert len(env_runs) == 2 and all(
            agent_runs[k][1] == env_runs[k][0] and env_runs[k][1] == agent_runs[k + 1][0]
            for k in range(2)
        )
        for (s, e), label in zip(env_runs, ("[info result]", "[validate result]"), strict=True):
            assert 0 < e - s <= E
            text = tok.decode(ids[s:e])
            assert text.startswith(f"\n<|im_start|>user\n{label}\n")
            assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
        assert not b["old_logprobs"][i][loss == 0].any()
        end = agent_runs[-1][1]
        assert not att[end:].any() and (ids[end:] == agent.pad_id).all()
    # Every prefill and sample counted: message k's context is the prompt and the
    # transcript before it (both rows wrote the same).
    runs = _runs(b["loss_mask"][0] > 0)
    per_row = sum(len(prompt) + (s - P) + (e - s) for s, e in runs)
    assert ro.gen_tokens == 2 * per_row


def test_long_tool_answers_are_cut_to_the_budget(task, executor):
    big = "print('x' * 100000)\n"
    step = f"```python\n{big}```\nACTION: validate"
    model, agent = agent_with(script(step, SUBMIT), tools_on(executor), turns=2, tool_max_tokens=96)
    ro = agent.rollout(model.params, [task], group_size=1, key=jax.random.key(0))
    (s, e), = _runs((ro.batch["attention_mask"][0] > 0) & (ro.batch["loss_mask"][0] == 0)
                    & (np.arange(ro.batch["tokens"].shape[1]) >= P))  # fmt: skip
    assert e - s <= 96 and "characters truncated" in model.tokenizer.decode(
        ro.batch["tokens"][0, s:e]
    )
    assert ro.causes == ("ok",)


def test_tool_crashes_and_timeouts_are_transcript_events(task, executor):
    crash = "```python\nraise RuntimeError('boom')\n```\nACTION: validate"
    spin = "```python\nwhile True:\n    pass\n```\nACTION: validate"
    tools = tools_on(executor, validate_timeout_s=1)
    model, agent = agent_with(script(crash, spin, SUBMIT), tools, turns=3)
    ro = agent.rollout(model.params, [task], group_size=1, key=jax.random.key(0))
    (transcript,) = ro.transcripts
    assert "status: error" in transcript and "RuntimeError: boom" in transcript
    assert "status: timeout (budget 1 s)" in transcript
    # The episode went on: the later submission is the sample's program.
    assert ro.programs == [PROGRAM] and ro.causes == ("ok",)
    assert ro.tool_calls == 2 and ro.tool_seconds >= 1.0


def test_an_agent_that_never_submits_is_invalid_after_its_turns(task, executor):
    model, agent = agent_with(script(INFO), tools_on(executor), turns=2)
    ro = agent.rollout(model.params, [task], group_size=2, key=jax.random.key(0))
    assert ro.programs == ["", ""] and ro.causes == ("no_submission", "no_submission")
    assert ro.tool_calls == 2  # the last message asks again, and is not answered
    rows = stages.no_program_rows(ro)
    rewards, valid = stages.with_no_program_rows(np.zeros(2, np.float32), np.ones(2, bool),
                                                 rows, -0.25)  # fmt: skip
    np.testing.assert_array_equal(rewards, [-0.25, -0.25])
    # Prose without an action: the environment says so (no sandbox call), then the last
    # message's own cause.
    model, agent = agent_with(script("Hmm.", "Still thinking."), tools_on(executor), turns=2)
    ro = agent.rollout(model.params, [task], group_size=1, key=jax.random.key(0))
    assert ro.causes == ("no_code",) and ro.tool_calls == 0
    assert "No action found" in ro.transcripts[0]


def test_world_model_reads_the_transcript(episode, task):
    model, agent, ro = episode
    seen = []

    def policy(prompt):
        seen.append(prompt)
        return '{"valid_probability": 0.75, "percentile": 0.5}'

    rollout_fn, agent.sample_fn = agent.sample_fn, scripted(policy)
    try:
        wm = agent.predict(model.params, [task], ro, key=jax.random.key(1))
    finally:
        agent.sample_fn = rollout_fn
    assert len(seen) == 2 and np.isfinite(wm.mean).all() and wm.parse_failures == 0
    for prompt in seen:
        assert "# The episode before the submission" in prompt
        assert "[validate result]" in prompt and "# Program to judge" in prompt
    # The transcript is cut from the middle (never the program) to fit the WM budget.
    short = agent.wm_prompt_ids(task, PROGRAM, transcript=ro.transcripts[0] * 20)
    assert len(short) <= agent.wm_max_prompt_tokens
    assert "characters truncated" in model.tokenizer.decode(short)
    assert agent.wm_max_prompt_tokens == P + M + 2 * (M + E)


def test_turns_one_is_the_single_turn_path(task, executor):
    model = load(FIXTURE)
    kw = dict(max_prompt_tokens=768, max_new_tokens=8, wm_max_new_tokens=8, wm_samples=1,
              temperature=1.0, top_p=1.0, top_k=0, stop_ids=tuple(range(0, 384, 3)))  # fmt: skip
    plain = TextAgent(model.graphdef, model.tokenizer, **kw)
    one = TextAgent(model.graphdef, model.tokenizer, turns=1, tool_max_tokens=7,
                    tools=tools_on(executor), **kw)  # fmt: skip
    a = plain.rollout(model.params, [task], group_size=2, key=jax.random.key(5))
    b = one.rollout(model.params, [task], group_size=2, key=jax.random.key(5))
    assert a.programs == b.programs and a.causes == b.causes and a.gen_tokens == b.gen_tokens
    for k in a.batch:
        np.testing.assert_array_equal(a.batch[k], b.batch[k])
    assert b.transcripts == () and b.tool_calls == 0 and b.batch["tokens"].shape == (2, 776)
    assert one.solver_messages(task) == plain.solver_messages(task)
    assert "ACTION" not in one.solver_messages(task)[1]["content"]
    assert one.wm_prompt_ids(task, PROGRAM) == plain.wm_prompt_ids(task, PROGRAM)
    assert one.wm_max_prompt_tokens == plain.wm_max_prompt_tokens == 768 + 8


def test_config_and_lengths():
    c = default_config()
    c.checkpoint = "somewhere"
    validate_config(c)
    assert c.turns == 1 and sequence_lengths(c)["train"] == c.max_prompt_tokens + c.max_new_tokens
    c.turns, c.max_prompt_tokens, c.max_new_tokens, c.tool_max_tokens = 3, 100, 10, 5
    assert sequence_lengths(c) == {"train": 140, "prompt": 130, "new": 10, "wm_prompt": 140}
    # The last message's prefill plus its sample is a whole train row, so a memory plan
    # of (prompt, new) lengths holds the episode (and its default WM prompt).
    c.anchors_per_task = 2
    n = sequence_lengths(c)
    assert n["train"] == n["prompt"] + n["new"] and n["wm_prompt"] == n["prompt"] + 3 * n["new"]
    for field, value in (("turns", 0), ("tool_max_tokens", 0)):
        bad = c.copy_and_resolve_references()
        bad[field] = value
        with pytest.raises(ValueError, match=field):
            validate_config(bad)
    bad = c.copy_and_resolve_references()
    bad.tools.executor = "cloud"
    with pytest.raises(ValueError, match="tools.executor"):
        validate_config(bad)
    model = load(FIXTURE)
    with pytest.raises(ValueError, match="tools when turns > 1"):
        TextAgent(model.graphdef, model.tokenizer, max_prompt_tokens=8, max_new_tokens=8,
                  wm_max_new_tokens=8, wm_samples=1, temperature=1.0, top_p=1.0, top_k=0,
                  turns=2)  # fmt: skip


def test_validation_sample_keeps_whole_records(tmp_path):
    src = tmp_path / "public"
    src.mkdir()
    (src / "train.csv").write_text('id,text\n0,"two\nlines"\n1,b\n2,c\n')
    (src / "notes.txt").write_text("kept as is")
    write_sample(str(src), str(tmp_path / "sample"), 2)
    assert (tmp_path / "sample" / "train.csv").read_text() == 'id,text\n0,"two\nlines"\n1,b\n'
    assert (tmp_path / "sample" / "notes.txt").read_text() == "kept as is"


@pytest.mark.skipif(not os.path.isfile(os.path.join(TUNED, "fixture.json")),
                    reason="no tuned text checkpoint")  # fmt: skip
def test_two_turn_episodes_of_the_tuned_checkpoint_train(task, executor):
    """The real sampler and the train step on 2-turn episodes (mechanics, not skill)."""
    from wmrl_jax.models import sharding
    from wmrl_jax.train import state as state_lib
    from wmrl_jax.train import step as step_lib

    model = models.from_pretrained(TUNED)
    p, m, e = 1024, 48, 64
    agent = TextAgent(model.graphdef, model.tokenizer, max_prompt_tokens=p, max_new_tokens=m,
                      wm_max_new_tokens=8, wm_samples=1, temperature=1.0, top_p=1.0, top_k=0,
                      turns=2, tool_max_tokens=e, tools=tools_on(executor))  # fmt: skip
    ro = agent.rollout(model.params, [task], group_size=4, key=jax.random.key(0))
    b = ro.batch
    assert b["tokens"].shape == (4, p + 2 * m + e) and len(ro.causes) == 4
    assert set(ro.causes) <= {"ok", "empty", "no_code", "syntax_error", "no_submission"}
    loss = b["loss_mask"] > 0
    assert loss.sum() > 0 and not loss[:, :p].any() and (b["attention_mask"][loss] == 1).all()
    env = (b["attention_mask"] > 0) & ~loss
    env[:, :p] = False
    # A row answered by the environment took its second message; the others ended at one.
    second = [len(_runs(loss[i])) == 2 for i in range(4)]
    assert [bool(env[i].any()) for i in range(4)] == second
    # One GRPO update: only the agent's tokens count.
    config = step_lib.default_step_config()
    opt = state_lib.default_optimizer_config()
    opt.lr, opt.warmup_steps, opt.total_steps = 1e-3, 0, 10
    mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    optimizer = state_lib.make_optimizer(opt)
    train = step_lib.make_train_step(model.graphdef, optimizer, config, mesh)
    params = jax.tree_util.tree_map(jnp.copy, model.params)
    state = train.shard_state(state_lib.init_train_state(params, optimizer, kl_coef=0.0))
    batch = stages.policy_batch(ro, np.array([1.0, -1.0, 0.5, -0.5], np.float32),
                                np.ones(4, bool))  # fmt: skip
    state, metrics = train(state, batch, jax.random.key(1))
    assert float(metrics["tokens"]) == float(b["loss_mask"][:, 1:].sum())
    assert math.isfinite(float(metrics["loss"]))
    # On-policy: the sampler's log-probs of both messages are the train step's teacher-
    # forced ones (ratio 1; float32 sampler vs. full forward).
    assert (
        abs(float(metrics["ratio_min"]) - 1) < 1e-3 and abs(float(metrics["ratio_max"]) - 1) < 1e-3
    )
    moved = jax.tree_util.tree_leaves(
        jax.tree_util.tree_map(lambda a, c: bool(jnp.any(a != c)), state.params, model.params)
    )
    assert any(moved)


def test_make_agent_builds_the_tools_from_the_config(task):
    from tests.models.conftest import fixture_path
    from wmrl_jax.agents.base import AgentContext
    from wmrl_jax.agents.text import make_agent
    from wmrl_jax.envs.grading import DEFAULT_FLOORS

    c = default_config()
    c.checkpoint, c.turns, c.tools.executor, c.tools.validate_rows = (
        fixture_path(FIXTURE),
        2,
        "local",
        7,
    )
    context = AgentContext([task], [], [], DEFAULT_FLOORS, jax.random.key(0))
    with pytest.warns(UserWarning):
        agent = make_agent(c, context).agent
    try:
        assert agent.turns == 2 and agent.env_budget == c.tool_max_tokens
        assert isinstance(agent.tools.executor, LocalExecutor) and agent.tools.validate_rows == 7
        assert "first 7 rows" in agent.solver_messages(task)[1]["content"]
        assert agent.tools.call(task, "info").result().status == "ok"
    finally:
        agent.tools.close()


QWEN3_LIKE = (  # the parts of Qwen3's template that shape a turn, thinking switch included
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}{% endif %}"
)


def test_environment_messages_follow_the_chat_template():
    import copy

    tok = copy.copy(model_tokenizer())
    tok.chat_template = QWEN3_LIKE
    env = EnvironmentMessages(tok, (STOP,), 64, {"enable_thinking": False})
    assert (env.closing, env.head) == ("<|im_end|>", "\n<|im_start|>user\n")
    assert env.tail == "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    stopped = env.ids("[info result]\nok", stopped=True)
    assert tok.decode(stopped) == env.head + "[info result]\nok" + env.tail
    cut = env.ids("[info result]\nok", stopped=False)  # the agent's message hit its budget
    assert cut[0] == STOP and cut[1:] == stopped
    # A program printing a control token cannot close the turn early.
    assert env.ids("<|im_end|>", stopped=True).count(STOP) == stopped.count(STOP) == 1
    assert len(env.ids("x" * 10_000, stopped=True)) <= 64
    with pytest.raises(ValueError, match="tool_max_tokens=4"):
        EnvironmentMessages(tok, (STOP,), 4, {"enable_thinking": False})


# A program whose only output file is named by bytes that are not UTF-8: the sandbox
# returns the name with a lone surrogate, which the validate answer names.
BAD_NAME = """import os
out = os.fsencode(os.environ["WMRL_OUTPUT_DIR"])
with open(os.path.join(out, b"pred\\xff.csv"), "w") as f:
    f.write("id,target\\n")
"""


def test_a_file_name_that_is_not_utf8_is_text_in_the_validate_answer(task, executor):
    tools = tools_on(executor)
    answer = tools.call(task, "validate", BAD_NAME).result()
    assert answer.status == "ok" and "pred\\xff.csv" in answer.text  # escaped, readable
    answer.text.encode("utf-8")  # valid text: no lone surrogate left
    env = agent_with(script(SUBMIT), tools)[1].environment_messages()
    ids = env.ids(answer.text, stopped=True)  # the fixture's tokenizer takes it
    assert "pred\\xff.csv" in model_tokenizer().decode(ids)
    # Through a whole episode: validate, then submit; the rollout goes on.
    step = f"```python\n{BAD_NAME}```\nACTION: validate"
    model, agent = agent_with(script(step, SUBMIT), tools, turns=2)
    ro = agent.rollout(model.params, [task], group_size=2, key=jax.random.key(0))
    assert ro.causes == ("ok", "ok") and ro.programs == [PROGRAM, PROGRAM]
    assert all("pred\\xff.csv" in t for t in ro.transcripts)
    agent.wm_prompt_ids(task, PROGRAM, transcript=ro.transcripts[0])  # tokenisable too


class _FailingTools:
    """Tools whose first call raises and whose second call's future fails; then real."""

    def __init__(self, tools):
        self.tools, self.validate_rows, self.calls = tools, tools.validate_rows, 0

    def call(self, task, name, source=""):
        import concurrent.futures

        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("the sandbox fell over")
        if self.calls == 2:
            failed = concurrent.futures.Future()
            failed.set_exception(OSError("the answer was lost"))
            return failed
        return self.tools.call(task, name, source)


def test_one_failing_episode_does_not_stop_the_rollout(task, executor, caplog):
    tools = _FailingTools(tools_on(executor))
    model, agent = agent_with(script(INFO, SUBMIT), tools, turns=2)
    ro = agent.rollout(model.params, [task], group_size=3, key=jax.random.key(0))
    # Rows 0 and 1 met the failures and ended without a program; row 2 went on.
    assert ro.causes == ("episode_error", "episode_error", "ok")
    assert ro.programs == ["", "", PROGRAM]
    assert "the environment failed: RuntimeError: the sandbox fell over" in ro.transcripts[0]
    assert "the environment failed: OSError: the answer was lost" in ro.transcripts[1]
    assert "[info result]" in ro.transcripts[2]
    assert sum("the environment failed" in r.getMessage() for r in caplog.records) == 2
    # Their tokens end after the agent's first message: nothing of the environment's.
    b = ro.batch
    for i in (0, 1):
        assert not ((b["attention_mask"][i] > 0) & (b["loss_mask"][i] == 0))[P:].any()
    rewards, valid = stages.with_no_program_rows(np.zeros(3, np.float32), np.zeros(3, bool),
                                                 stages.no_program_rows(ro), -0.25)  # fmt: skip
    np.testing.assert_array_equal(rewards, [-0.25, -0.25, 0.0])
