"""Shared by the text agent's tests: a toy task and a `TextAgent` on the tiny checkpoint."""

from __future__ import annotations

import types

from tests.envs.conftest import base_manifest
from tests.models.conftest import load
from wmrl_jax.agents.text.agent import TextAgent
from wmrl_jax.envs.task import parse_manifest

FIXTURE = "qwen3_gqa1_tied"  # smallest full-attention fixture: 2 layers, width 64, vocab 384
P, M = 768, 8
STOPS = tuple(range(0, 384, 3))  # many stop ids, so gibberish rows stop at varied lengths


def text_task(task_id="toy", description="Predict the target from features f0..f3.", report=None):
    """A task with what the text agent's prompts read (no files)."""
    spec = parse_manifest(base_manifest(id=task_id), "unused")
    return types.SimpleNamespace(
        id=task_id,
        public_dir=f"public-{task_id}",
        description=description,
        data_report="rows: 100\ncolumns: id, f0, f1, target" if report is None else report,
        submission=spec.submission,
        metric=spec.metric,
    )


def text_agent(**kw):
    """`(model, TextAgent)` on the `FIXTURE` checkpoint with P, M and `STOPS`; `kw` override."""
    model = load(FIXTURE)
    args = dict(
        max_prompt_tokens=P,
        max_new_tokens=M,
        wm_max_new_tokens=8,
        wm_samples=2,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        stop_ids=STOPS,
    )
    args.update(kw)
    return model, TextAgent(model.graphdef, model.tokenizer, **args)
