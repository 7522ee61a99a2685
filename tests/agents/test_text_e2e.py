"""The text agent's success path, end to end: the main job's text-agent runlocal on the
tuned tiny checkpoint (`wmrl_jax.agents.text.fixture`) writes valid programs that are
executed and graded, world-model answers that parse, anchors that fit the debiasing map,
and a policy update that moves the weights."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from wmrl_jax.agents.programs import PROGRAM_CAUSES, find_program
from wmrl_jax.agents.text import fixture as text_fixture
from wmrl_jax.models.safetensors_io import open_tensors
from wmrl_jax.worldmodel.parsing import FAILURE_STATUSES, parse_wm_answer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = "experiments/configs/qwen3_4b_mledojo.py:runlocal"
TUNED = os.path.join("tests", "agents", "fixtures", "qwen3_text_tuned")
RECORD = os.path.join(REPO, TUNED, "fixture.json")
ROWS = 2 * 2  # runlocal: tasks_per_step x group_size
WM_SAMPLES = 2

needs_fixture = pytest.mark.skipif(
    not os.path.isfile(RECORD),
    reason=f"no tuned checkpoint at {TUNED}: python -m wmrl_jax.agents.text.fixture builds it",
)


def _record() -> dict:
    with open(RECORD, encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    shape = _record()["shape"]
    workdir = tmp_path_factory.mktemp("text_runlocal")
    flags = [f"--config.agent.text.checkpoint={TUNED}"]
    flags += [f"--config.agent.text.{k}={v}" for k, v in sorted(shape.items())]
    cmd = [sys.executable, "-m", "experiments.train", f"--config={CONFIG}", f"--workdir={workdir}"]
    proc = subprocess.run(
        [*cmd, *flags, "--config.tasks_per_step=2", "--config.group_size=2",
         f"--config.agent.text.wm_samples={WM_SAMPLES}"],
        cwd=REPO, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    (step,) = [r for r in rows if r["step"] == 1 and "train/loss" in r]
    return workdir, step


def _asked(m: dict) -> float:
    """Rows holding a program (the others are invalid without running anything)."""
    return ROWS - sum(m[f"programs/none/{cause}"] for cause in PROGRAM_CAUSES[1:])


@needs_fixture
def test_valid_programs_are_executed_and_graded(run):
    workdir, m = run
    assert _asked(m) > 0, m  # valid-program fraction > 0
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["environment"].startswith("local")
    assert summary["ledger"]["executions"] >= 1 and summary["ledger"]["exec_seconds"] > 0
    assert math.isfinite(m["reward/real_mean"]) and math.isfinite(m["reward/fed_mean"])
    # Held-out programs of the updated policy, executed and graded on the leaderboard.
    assert m["eval/valid_fraction"] > 0 and m["eval/heldout_percentile"] > 0


@needs_fixture
def test_world_model_answers_parse(run):
    _, m = run
    unusable = sum(m[f"wm/parse_fail/{cause}"] for cause in FAILURE_STATUSES)
    assert unusable < 0.5 * _asked(m) * WM_SAMPLES, m
    assert m["wm/parse_failures"] < _asked(m) and math.isfinite(m["wm/pred_mean"])


@needs_fixture
def test_anchors_fit_the_debiasing_map_and_the_policy_moves(run):
    workdir, m = run
    assert m["anchors/groups"] >= 1
    assert m["correction/n_anchors"] >= 1 and m["correction/buffer_size"] >= 1, m
    assert m["correction/map_knots"] >= 1
    assert math.isfinite(m["train/loss"]) and m["train/grad_norm"] > 0, m
    before = open_tensors(os.path.join(REPO, TUNED, "model.safetensors"))
    after = open_tensors(os.path.join(workdir, "policy_hf", "model.safetensors"))
    assert before.keys() == after.keys()
    moved = [k for k in before if not np.array_equal(before[k], np.asarray(after[k], np.float32))]
    assert moved, "the policy update changed no weight"


@needs_fixture
def test_the_fixture_was_tuned_on_the_agents_current_prompts():
    record = _record()
    shape = text_fixture.AgentShape(**record["shape"])
    assert text_fixture.prompts_digest(shape) == record["prompts_digest"], (
        "the agent's prompts changed since the fixture was tuned: rebuild it with "
        "python -m wmrl_jax.agents.text.fixture"
    )
    assert record["check"]["rollout_programs"] > 0 and record["check"]["distinct_programs"] > 1


def test_taught_answers_parse_as_taught():
    for v in text_fixture.variants():
        parsed = find_program(text_fixture.solver_answer(v.source))
        assert parsed.ok and parsed.source == v.source
    answer = parse_wm_answer(text_fixture.wm_answer(0.9, 0.625), invalid_reward=-0.25)
    assert answer.usable and answer.valid_probability == 0.9 and answer.percentile == 0.62
    assert sum(v.probability for v in text_fixture.variants()) == pytest.approx(1.0)


def test_pack_left_pads_and_weights_the_completion():
    ids, mask, weight = text_fixture.pack([([5, 6], [7, 8, 9]), ([1], [2])], pad_id=0, multiple=4)
    np.testing.assert_array_equal(ids, [[0, 0, 0, 5, 6, 7, 8, 9], [0, 0, 0, 0, 0, 0, 1, 2]])
    np.testing.assert_array_equal(mask, [[0, 0, 0, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0, 1, 1]])
    np.testing.assert_array_equal(weight, [[0, 0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0, 0, 1]])
