"""The absl launches: each config's `runlocal` variant, config typos, kill -9 and resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _launch(config: str, workdir, *flags: str, **kwargs) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "experiments.train", f"--config={config}", f"--workdir={workdir}"]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.Popen(
        [*cmd, *flags], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, **kwargs,
    )  # fmt: skip


def _run(config: str, workdir, *flags: str, timeout: float = 600) -> str:
    proc = _launch(config, workdir, *flags)
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-4000:]
    return out


def _history(workdir):
    with open(os.path.join(workdir, "summary.json")) as f:
        summary = json.load(f)
    return [{k: v for k, v in h.items() if "seconds" not in k} for h in summary["history"]]


def test_tiny_cpu_runlocal_executes_for_real(tmp_path):
    out = _run("experiments/configs/tiny_cpu.py:runlocal", tmp_path, "--config.executor.kind=local")
    assert "held-out percentile, after" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["environment"] == "local"
    assert summary["ledger"]["executions"] > 0 and summary["ledger"]["exec_seconds"] > 0
    assert (tmp_path / "heldout.png").stat().st_size > 0
    assert (tmp_path / "policy_hf" / "config.json").exists()
    assert any(p.name.startswith("events.out.tfevents") for p in tmp_path.rglob("*"))


@pytest.mark.parametrize("name", ["qwen3_4b_mledojo", "qwen3_8b_mledojo"])
def test_gpu_configs_runlocal(tmp_path, name):
    out = _run(f"experiments/configs/{name}.py:runlocal", tmp_path)
    assert "held-out percentile, after" in out


def test_a_config_typo_fails_before_any_work(tmp_path):
    proc = _launch(
        "experiments/configs/tiny_cpu.py:runlocal", tmp_path, "--config.anchor_fractoin=0.2"
    )
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "anchor_fractoin" in out
    assert not os.path.exists(tmp_path / "checkpoints")


def test_kill_and_resume_continue_the_run(tmp_path):
    flags = ("--config.executor.kind=replay", "--config.num_steps=6", "--config.eval_every=3")
    config = "experiments/configs/tiny_cpu.py:runlocal"
    _run(config, tmp_path / "full", *flags)
    victim = tmp_path / "killed"
    proc = _launch(config, victim, *flags, "--config.checkpoint.every=2")
    ckpt = victim / "checkpoints"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if ckpt.exists() and any(p.name.isdigit() and int(p.name) >= 2 for p in ckpt.iterdir()):
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    _run(config, victim, *flags, "--config.checkpoint.every=2")
    assert _history(victim) == _history(tmp_path / "full")
    # Another run on that workdir: the resume guard refuses in one line, naming the seed
    # and not the number of workers, which may change (before: a ValueError traceback).
    other = _launch(config, victim, *flags, "--config.seed=1", "--config.executor.workers=3")
    out, _ = other.communicate(timeout=300)
    assert other.returncode == 1, out[-4000:]
    assert "error: ResumeError: " in out and "another run (config seed)" in out, out[-4000:]
    assert "Traceback" not in out and "workers" not in out, out[-4000:]


def test_compute_study_runlocal_writes_its_outputs(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# x\n<!-- study-headline:begin -->\nold\n<!-- study-headline:end -->\n")
    page = tmp_path / "docs" / "compute_study.md"
    page.parent.mkdir()
    page.write_text("# x\n<!-- study:begin -->\nold\n<!-- study:end -->\ntail\n")
    cmd = [
        sys.executable, "-m", "experiments.study_compute",
        "--config=experiments/configs/study_compute.py:runlocal",
        f"--workdir={tmp_path / 'study'}",
    ]  # fmt: skip

    def run(*flags):
        proc = subprocess.run(
            cmd + list(flags), cwd=REPO, env=dict(os.environ, JAX_PLATFORMS="cpu"),
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-4000:]
        return proc.stderr

    # A study of four arms, then extended by the fifth: only that one runs again.
    four = "--config.study.arms=('real','anchors_only','wm_naive','wmrl')"
    first = run(four)
    # Run again (as after a kill), its finished runs are read back, not trained again,
    # also when only the study's own section changed (it is read by no run).
    metrics = tmp_path / "study" / "runs" / "wmrl_seed0" / "metrics.jsonl"
    mtime = metrics.stat().st_mtime_ns
    again = run(four, "--config.study.smooth=2")
    assert metrics.stat().st_mtime_ns == mtime

    def lines(log):
        return sorted(line[line.index("seed ") :] for line in log.splitlines() if " s wall" in line)

    assert len(lines(first)) == 4 and lines(again) == lines(first)
    log = run("--extend", "--config.study.smooth=2", f"--readme={readme}")
    assert "wmrl_plus: held-out" in log and "wmrl: held-out" not in log
    results = json.loads((tmp_path / "study" / "results.json").read_text())
    arms = {"real", "anchors_only", "wm_naive", "wmrl", "wmrl_plus"}
    assert set(results["analysis"]) == arms
    assert set(results["analysis_modelled"]) == arms and set(results["break_even"]) == {
        "1000000000.0", "4000000000.0"
    }  # fmt: skip
    a = results["analysis"]
    assert a["wm_naive"]["executions_total"] == 0 < a["wmrl"]["executions_total"]
    # Equal compute: real spends it in fewer updates than the arms executing a quarter.
    assert a["real"]["updates"] < a["wmrl"]["updates"] and a["real"]["updates"] >= 1
    # Equal compute: every run that spends stops at the same budget, on the same grid.
    budget = 40.0
    for arm in ("real", "anchors_only", "wmrl"):
        for run in results["runs"][arm]:
            spent = run["steps"][-1]["ledger/compute_seconds"]
            assert spent >= budget or len(run["steps"]) == 6, (arm, spent)
    # The full section goes to the docs page beside the README, its answer to the README.
    text = page.read_text()
    assert "old" not in text and "| wmrl |" in text and text.endswith("tail\n")
    assert "| anchors_only |" in text and "Modelled ledger" in text
    assert "Does it beat `anchors_only`?" in text and "`wmrl_plus` (all three) ends" in text
    assert "![compute study](study_compute.png)" in text
    head = readme.read_text()
    assert "old" not in head and "Does it beat `anchors_only`?" in head
    # A study with its own section (the real sweep's, the paired study's) writes that
    # section of the page, with its own plot, and no README headline.
    from wmrl_jax.studies import compute_report

    payload = json.loads((tmp_path / "study" / "results.json").read_text())
    payload["config"]["study"]["section"] = "paired"
    other = tmp_path / "other"
    other.mkdir()
    (other / "results.json").write_text(json.dumps(payload))
    page.write_text("<!-- study:begin -->\nS\n<!-- study:end -->\n"
                    "<!-- paired:begin -->\nP\n<!-- paired:end -->\n")  # fmt: skip
    compute_report.render(str(other), None, str(page))
    text = page.read_text()
    assert "\nS\n" in text and "\nP\n" not in text and "| wmrl |" in text
    assert "![compute study](study_compute_paired.png)" in text
    assert (page.parent / "study_compute_paired.png").is_file()
    assert readme.read_text() == head
    assert "| wmrl |" not in head and "`wmrl_plus`" not in head
    proc = subprocess.run(  # --extend refuses a study that ran with another config
        cmd + ["--extend", "--config.num_steps=7"], cwd=REPO, capture_output=True, text=True,
        env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300,
    )  # fmt: skip
    assert proc.returncode != 0 and "ran with another config" in proc.stderr
    assert "num_steps" in proc.stderr
    assert (tmp_path / "docs" / "study_compute.png").stat().st_size > 0
    # A README without the page beside it is refused before any run, naming the flag.
    page.unlink()
    proc = subprocess.run(
        cmd + [f"--readme={readme}"], cwd=REPO, capture_output=True, text=True,
        env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300,
    )  # fmt: skip
    assert proc.returncode != 0 and "--docs" in proc.stderr and "compute_study.md" in proc.stderr


# The absl entry point with its outcome source recorded: `close` writes the file
# $WMRL_TEST_CLOSED, so that the test sees the executor closed from outside.
_RECORDED_MAIN = """
import os
from absl import app
from experiments import train
from wmrl_jax.train import builder

make = builder.make_outcomes

def recorded(config, **kwargs):
    outcomes, environment = make(config, **kwargs)
    close = outcomes.close
    def closing():
        close()
        open(os.environ["WMRL_TEST_CLOSED"], "w").close()
    outcomes.close = closing
    return outcomes, environment

builder.make_outcomes = recorded
app.run(train.main)
"""


def test_sigterm_closes_the_executor_and_a_second_trainer_is_refused(tmp_path):
    workdir, closed = tmp_path / "run", tmp_path / "closed"
    flags = [f"--workdir={workdir}", "--config=experiments/configs/tiny_cpu.py:runlocal",
             "--config.executor.kind=replay", "--config.num_steps=20000",
             "--config.eval_every=10000", "--config.optimizer.total_steps=20000"]  # fmt: skip
    # 20,000 replayed steps take far longer than the test: the run is still going when
    # the signal comes, however fast the machine and however warm the compilation cache.
    env = dict(os.environ, JAX_PLATFORMS="cpu", WMRL_TEST_CLOSED=str(closed))
    proc = subprocess.Popen(
        [sys.executable, "-c", _RECORDED_MAIN, *flags], cwd=REPO, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    ckpt = workdir / "checkpoints"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if ckpt.exists() and any(p.name.isdigit() for p in ckpt.iterdir()):
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before it could be stopped"
    # A second trainer on the same workdir fails at once, naming the first.
    second = _launch("experiments/configs/tiny_cpu.py:runlocal", workdir, *flags[2:])
    out, _ = second.communicate(timeout=300)
    assert second.returncode == 1, out[-4000:]
    assert f"is in use by another trainer (pid {proc.pid})" in out
    assert not closed.exists()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, out[-4000:]
    assert "error: stopped by SIGTERM: executors closed" in out
    assert "Traceback" not in out
    assert closed.exists()


def test_tiny_cpu_with_the_synthetic_world_model_on_replay(tmp_path):
    _run("experiments/configs/tiny_cpu.py:runlocal", tmp_path, "--config.executor.kind=replay",
         "--config.world_model.kind=synthetic", "--config.world_model.synthetic.q=0.8",
         "--config.cost_model.params=1e9", "--config.cost_model.execution_seconds=30")  # fmt: skip
    summary = json.loads((tmp_path / "summary.json").read_text())
    steps = summary["steps"]
    assert all(-1.0 <= s["wm/q_realised"] <= 1.0 for s in steps if s["wm/q_groups"] > 0)
    assert summary["ledger"]["wm_rows"] > 0
    last = steps[-1]
    assert last["ledger/modelled_compute_seconds"] >= 30.0 * last["ledger/executions"] > 0
