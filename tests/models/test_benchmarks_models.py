"""The model benchmarks run end to end on a tiny preset (anchors skipped; no timings checked)."""

import json
import subprocess
import sys


def _run(args, tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            *args,
            "--preset",
            "tiny",
            "--skip",
            "torch,tunix",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


def test_forward_benchmark_tiny(tmp_path):
    payload, stdout = _run(
        ["benchmarks.forward", "--batch", "2", "--seq", "16", "--repeats", "1"], tmp_path
    )
    assert payload["ours"]["tokens_per_s"] > 0 and "| ours |" in stdout


def test_sampler_benchmark_tiny(tmp_path):
    payload, stdout = _run(
        ["benchmarks.sampler", "--batches", "2", "--prompt", "8", "--new", "4", "--repeats", "1"],
        tmp_path,
    )
    assert [r["impl"] for r in payload["rows"]] == ["ours"] and "| 2 | ours |" in stdout
