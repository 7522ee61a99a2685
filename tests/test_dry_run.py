"""`experiments/train.py --dry_run`: the plan on stdout, the exit status, the knob on stderr."""

from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _dry_run(config: str, *flags: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "experiments.train", f"--config={config}", "--dry_run", *flags]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_a_run_that_does_not_fit_exits_1_naming_the_knob(tmp_path):
    # The config fits with its per-layer remat; without it, training does not.
    proc = _dry_run(
        "experiments/configs/qwen3_8b_mledojo.py", "--dry_run_model=qwen3-8b",
        "--dry_run_device=h200", f"--workdir={tmp_path}", "--config.train.remat=False",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "memory plan per device: h200, mesh data=1, fsdp=8, tensor=1" in proc.stdout
    assert "8,190,735,360 params in bfloat16" in proc.stdout
    assert proc.stderr.startswith("error: the run does not fit: ") and "training: " in proc.stderr
    assert "config.train.num_microbatches=16" in proc.stderr
    assert not os.listdir(tmp_path)  # nothing loaded, nothing written


def test_a_run_that_fits_on_the_devices_present_exits_0():
    proc = _dry_run("experiments/configs/qwen3_5_9b_mledojo.py:runlocal")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "architecture: tests/models/fixtures/qwen3_5_text_untied" in proc.stdout
    assert proc.stdout.rstrip().endswith("fits")
