"""LoRA end to end: the main job's text-agent runlocal with `train.lora.rank` set, on the
tuned tiny checkpoint, trains the adapters, checkpoints them alone, resumes from that
checkpoint, and exports the merged policy as a plain Hugging Face directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from tests.agents.test_text_e2e import CONFIG, REPO, TUNED, _record, needs_fixture
from tests.train.test_lora_step import saved_params
from wmrl_jax.models.safetensors_io import open_tensors

RANK = 8


def _train(workdir, num_steps: int) -> subprocess.CompletedProcess:
    shape = _record()["shape"]
    flags = [f"--config.agent.text.checkpoint={TUNED}"]
    flags += [f"--config.agent.text.{k}={v}" for k, v in sorted(shape.items())]
    flags += [
        "--config.tasks_per_step=2",
        "--config.group_size=2",
        "--config.agent.text.wm_samples=2",
    ]
    # LoRA, and a schedule whose length does not depend on num_steps (the resume extends it).
    flags += [f"--config.train.lora.rank={RANK}", "--config.optimizer.total_steps=4"]
    cmd = [sys.executable, "-m", "experiments.train", f"--config={CONFIG}", f"--workdir={workdir}"]
    proc = subprocess.run(
        [*cmd, *flags, f"--config.num_steps={num_steps}"],
        cwd=REPO, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc


@needs_fixture
def test_lora_runlocal_trains_checkpoints_adapters_resumes_and_exports_merged(tmp_path):
    _train(tmp_path, 1)
    saved = saved_params(tmp_path / "checkpoints" / "1" / "state")
    assert saved and all("lora" in path for path in saved), sorted(saved)[:5]
    assert not any(p[-1] == "kernel" or p[0] == "embed_tokens" for p in saved)
    resumed = _train(tmp_path, 2)
    # The second run starts from the checkpoint of step 1: it trains step 2 only.
    assert "step  2/2" in resumed.stdout and "step  1/2" not in resumed.stdout, resumed.stdout
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    trained = {r["step"]: r for r in rows if "train/loss" in r}
    assert sorted(trained) == [1, 2]
    assert all(r["train/grad_norm"] > 0 and np.isfinite(r["train/loss"]) for r in trained.values())
    # The export is the base's architecture with the adapters folded in: same tensors,
    # some adapted kernels moved, the embedding and norms (never adapted) bit-equal.
    before = open_tensors(os.path.join(REPO, TUNED, "model.safetensors"))
    after = open_tensors(os.path.join(tmp_path, "policy_hf", "model.safetensors"))
    assert before.keys() == after.keys()
    moved = {k for k in before if not np.array_equal(before[k], np.asarray(after[k]))}
    assert moved and all(k.endswith("proj.weight") for k in moved), sorted(moved)
    config = json.loads((tmp_path / "policy_hf" / "config.json").read_text())
    assert config == json.loads(open(os.path.join(REPO, TUNED, "config.json")).read())
