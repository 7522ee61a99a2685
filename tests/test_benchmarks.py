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
