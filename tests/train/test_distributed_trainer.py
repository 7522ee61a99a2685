"""The trainer across processes: the main job's runlocal config as two `jax.distributed`
CPU processes (one CPU device each, coordinator on 127.0.0.1) against one process of two
forced CPU devices on the same data=2 mesh, through `python -m experiments.train`.

The two-process run stops after step 2 and is resumed to step 3 from its checkpoint
(restored on both processes); the single process trains 3 steps straight. Sampling,
the world model and the updates are the same SPMD programs on the same device layout
and the replay executor answers deterministically, so the two runs draw the same
programs and agree on every metric that is not a measured second; the final params
agree within fp32 tolerance (the gradient all-reduce crosses processes in one run
and stays in one process in the other).

Cost (compilation dominates): no warm start (it runs on each process's own device,
the same everywhere, and is tested with the agent), one device per process (sampling
is replicated over the mesh's devices), and one compilation cache for every launch, so
that the resumed processes reuse what the first ones compiled.
"""

import json
import os
import re
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

from wmrl_jax.train import writer
from wmrl_jax.train.checkpoint import Checkpointer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLAGS = [
    "--config=experiments/configs/tiny_cpu.py:runlocal",
    "--config.executor.kind=replay",
    "--config.mesh.data=2",
    "--config.agent.recipe.warm_start.steps=0",
    # A schedule that does not depend on num_steps, so that a run may be extended.
    "--config.optimizer.total_steps=8",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(workdir, log_name: str, devices: int, num_steps: int, **layout) -> subprocess.Popen:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("WMRL_", "SLURM_", "JOB_COMPLETION_INDEX"))
    }
    env.update(
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
        JAX_COMPILATION_CACHE_DIR=os.path.join(os.path.dirname(workdir), "jax_cache"),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        PYTHONPATH=REPO,
        **layout,
    )
    log = open(os.path.join(os.path.dirname(workdir), log_name), "w")  # noqa: SIM115
    cmd = [sys.executable, "-m", "experiments.train", f"--workdir={workdir}", *FLAGS]
    return subprocess.Popen(
        [*cmd, f"--config.num_steps={num_steps}"],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def _two_processes(workdir, num_steps: int, tag: str) -> list[subprocess.Popen]:
    coordinator = f"127.0.0.1:{_free_port()}"
    return [
        _launch(
            workdir,
            f"{tag}{i}.log",
            1,
            num_steps,
            WMRL_COORDINATOR=coordinator,
            WMRL_NUM_PROCESSES="2",
            WMRL_PROCESS_ID=str(i),
        )
        for i in range(2)
    ]


def _wait(procs, logs_dir, timeout_s=1200):
    """Waits for every process; a failure (or the timeout) kills the others."""
    deadline = time.monotonic() + timeout_s
    while any(p.poll() is None for p in procs):
        if any(p.poll() not in (None, 0) for p in procs) or time.monotonic() > deadline:
            for p in procs:
                p.kill()
                p.wait()
            break
        time.sleep(0.2)
    if any(p.returncode != 0 for p in procs):
        logs = [
            f"--- {name}\n" + (logs_dir / name).read_text()[-3000:]
            for name in sorted(os.listdir(logs_dir))
            if name.endswith(".log")
        ]
        pytest.fail(f"exit codes {[p.returncode for p in procs]}:\n" + "\n".join(logs))


def _comparable(entries):
    """Everything but measured seconds (and what derives from them); NaN as None."""
    skip = ("seconds", "ledger/modelled")
    return [
        {k: None if v != v else v for k, v in e.items() if not any(s in k for s in skip)}
        for e in entries
    ]


def test_two_processes_train_resume_and_match_one(tmp_path):
    multi, single = tmp_path / "multi", tmp_path / "single"
    procs = _two_processes(multi, 2, "first")
    procs.append(_launch(single, "single.log", 2, 3))
    _wait(procs, tmp_path)
    assert Checkpointer(multi / "checkpoints", best_metric=None).latest_step() == 2
    resumed = _two_processes(multi, 3, "resumed")  # restores step 2 on both processes
    _wait(resumed, tmp_path)
    _check(tmp_path)


def _check(tmp_path):
    multi, single = tmp_path / "multi", tmp_path / "single"
    logs = {p.name: p.read_text() for p in tmp_path.glob("*.log")}
    assert "resuming after step 2" in logs["resumed0.log"]
    # Console, summary and metrics are process 0's: process 1 prints no step line.
    for tag, last in (("first", 2), ("resumed", 3)):
        assert re.search(rf"^step  {last}/{last} ", logs[f"{tag}0.log"], re.M)
        assert not re.search(r"^(step|eval|train) ", logs[f"{tag}1.log"], re.M)

    got, want = writer.read_jsonl(multi), writer.read_jsonl(single)
    assert [e["step"] for e in got] == [0, 1, 2, 3]  # each step once, none duplicated
    assert len(os.listdir(multi / "tensorboard")) == 2  # one events file per run, process 0's
    assert got[-1]["ledger/executions"] > 0  # anchors were executed (once: the same count)
    # Rewards, losses, executions and held-out percentiles agree step by step.
    for a, b in zip(_comparable(got), _comparable(want), strict=True):
        assert a.keys() == b.keys()
        for key in a:
            if isinstance(a[key], float) and isinstance(b[key], float):
                np.testing.assert_allclose(a[key], b[key], rtol=1e-4, atol=1e-5, err_msg=key)
            else:
                assert a[key] == b[key], key

    summary = json.loads((multi / "summary.json").read_text())
    assert summary["ledger"]["executions"] == want[-1]["ledger/executions"]
    params = load_file(str(multi / "policy_hf" / "model.safetensors"))
    reference = load_file(str(single / "policy_hf" / "model.safetensors"))
    assert params.keys() == reference.keys()
    for name, value in reference.items():
        np.testing.assert_allclose(params[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    assert all(e["train/grad_norm"] > 0 for e in got[1:])  # the params did move
