"""`python -m benchmarks.sandbox` runs end to end (smoke sizes; timings are not checked)."""

import json
import subprocess
import sys


def test_sandbox_benchmark_quick(tmp_path, docker_available):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.sandbox", "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    payload = json.loads(out.read_text())
    assert set(payload["backends"]) == {"local", "docker"}
    for entry in payload["backends"].values():
        assert entry["overhead"]["pass"]["available"]
        assert set(entry["throughput"]) == {"1", "2"}
