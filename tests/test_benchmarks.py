"""The benchmarks run end to end (reduced sizes; timings are not checked)."""

import json
import subprocess
import sys


def _run(args, tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", *args, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


def test_isotonic_benchmark_quick(tmp_path):
    payload, stdout = _run(["benchmarks.isotonic", "--quick"], tmp_path)
    assert "Targets" in stdout and "Traceback" not in stdout
    assert payload


def test_fusion_benchmark_small(tmp_path):
    payload, stdout = _run(["benchmarks.fusion", "--sizes", "1e3,1e4"], tmp_path)
    assert payload


def test_exact_benchmark_agrees_with_its_anchor(tmp_path):
    payload, stdout = _run(["benchmarks.exact", "--repeats", "1"], tmp_path)
    assert payload["max_abs_log_prob_diff"] < 1e-4 and payload["speedup"] > 0
    assert "recipe_probs" in stdout


# The model benchmarks on a tiny preset, anchors (torch, Tunix) skipped.
_TINY = ["--preset", "tiny", "--skip", "torch,tunix"]


def test_forward_benchmark_tiny(tmp_path):
    payload, stdout = _run(
        ["benchmarks.forward", *_TINY, "--batch", "2", "--seq", "16", "--repeats", "1"], tmp_path
    )
    assert payload["ours"]["tokens_per_s"] > 0 and "| ours |" in stdout


def test_sampler_benchmark_tiny(tmp_path):
    payload, stdout = _run(
        ["benchmarks.sampler", *_TINY, "--batches", "2", "--prompt", "8", "--new", "4"]
        + ["--repeats", "1"],
        tmp_path,
    )
    assert [r["impl"] for r in payload["rows"]] == ["ours"] and "| 2 | ours |" in stdout
