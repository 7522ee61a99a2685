"""Check GPU sandboxes on a GPU machine: a sandboxed program sees its GPUs, nothing else changes.

    python -m wmrl_jax.sandbox.gpu_check                 # 1 GPU, the CUDA image
    python -m wmrl_jax.sandbox.gpu_check --gpus=2 --per-program=1 --memory-fraction=0.5

`launch/gpu_sandbox_check.sh` builds the CUDA image and runs this. Each check
runs `PROGRAM` in a `DockerExecutor` container and reads the JSON it prints:
- with GPUs: JAX's default backend is the GPU, with the requested number of
  devices; a matmul on it is right; JAX's allocator limit is the advisory
  memory fraction of the device; the lockdown holds (only a loopback
  interface, read-only root, user nobody);
- without GPUs, same image: JAX finds no GPU (nothing leaks into a CPU run);
- with `--per-program=k` and at least two groups: two programs at once get
  disjoint devices (their PCI bus ids differ).
Exits 1 with the failed checks listed; prints one JSON line per run either way.
"""

import argparse
import concurrent.futures
import json
import shutil
import subprocess
import sys

from wmrl_jax.sandbox.docker_backend import DockerExecutor
from wmrl_jax.sandbox.gpus import GPU_LIMITS, parse_gpus
from wmrl_jax.sandbox.result import MiB

# What the program reports about itself; it asserts nothing, the host judges.
PROGRAM = """
import json, os, time
report = {
    "uid": os.getuid(),
    "interfaces": sorted(os.listdir("/sys/class/net")),
    "nvidia_visible_devices": os.environ.get("NVIDIA_VISIBLE_DEVICES"),
    "mem_fraction": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"),
}
try:
    open("/usr/lib/wmrl-write-check", "w")
    report["root_writable"] = True
except OSError:
    report["root_writable"] = False
gpus = "/proc/driver/nvidia/gpus"
report["bus_ids"] = sorted(os.listdir(gpus)) if os.path.isdir(gpus) else None
import jax, jax.numpy as jnp
devices = jax.devices()
report["platform"] = devices[0].platform
report["device_kinds"] = [d.device_kind for d in devices]
start = time.perf_counter()
x = jnp.ones((2048, 2048), jnp.float32)
report["matmul_right"] = float((x @ x).block_until_ready()[0, 0]) == 2048.0
report["matmul_s"] = time.perf_counter() - start
stats = devices[0].memory_stats() or {}
report["bytes_limit"] = stats.get("bytes_limit")
print(json.dumps(report))
"""


def _report(result) -> dict:
    if result.status != "ok":
        return {"status": result.status, "message": result.message, "stderr": result.stderr[-2000:]}
    lines = result.stdout.strip().splitlines()
    return {"status": "ok", **json.loads(lines[-1])} if lines else {"status": "no output"}


def _lockdown_failures(name: str, report: dict) -> list[str]:
    failures = []
    if report.get("interfaces") != ["lo"]:
        failures.append(f"{name}: network interfaces {report.get('interfaces')}, want ['lo']")
    if report.get("root_writable") is not False:
        failures.append(f"{name}: the root filesystem is writable")
    if report.get("uid") != 65534:
        failures.append(f"{name}: runs as uid {report.get('uid')}, want 65534")
    return failures


def check(
    *, gpus="1", image=None, per_program=None, memory_fraction=None, timeout_s=600.0
) -> tuple[list[dict], list[str]]:
    """Runs the checks (see the module docstring); returns (reports, failures)."""
    request = parse_gpus(gpus)
    if request is None:
        raise ValueError("the check needs GPUs: --gpus=1, all, or device ids")
    reports, failures = [], []
    with DockerExecutor(
        image, gpus=gpus, gpus_per_program=per_program, gpu_memory_fraction=memory_fraction,
        limits=GPU_LIMITS, timeout_s=timeout_s, max_workers=2,
    ) as ex:  # fmt: skip
        if ex.gpu_refusal:
            return reports, [ex.gpu_refusal]
        runs = 2 if per_program else 1
        futures = [ex.submit(PROGRAM) for _ in range(runs)]
        for i, future in enumerate(concurrent.futures.as_completed(futures)):
            report = {"run": f"gpu-{i}", **_report(future.result())}
            reports.append(report)
            failures += _gpu_failures(report, request, per_program, memory_fraction)
        image = ex.image
    if per_program and len(reports) == 2 and all(r.get("bus_ids") for r in reports):
        if set(reports[0]["bus_ids"]) & set(reports[1]["bus_ids"]):
            failures.append(f"two programs shared a device: {[r['bus_ids'] for r in reports]}")
    with DockerExecutor(image, limits=GPU_LIMITS, timeout_s=timeout_s) as ex:
        report = {"run": "cpu", **_report(ex.run(PROGRAM))}
    reports.append(report)
    if report.get("status") != "ok" or report.get("platform") != "cpu":
        failures.append(f"cpu: want JAX on the CPU without GPUs, got {report}")
    failures += _lockdown_failures("cpu", report)
    return reports, failures


def device_memory_bytes() -> int | None:
    """Memory of the host's first GPU (from nvidia-smi), or None where it cannot be read."""
    if shutil.which("nvidia-smi") is None:
        return None
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    try:
        return int(out.stdout.split()[0]) * MiB
    except (IndexError, ValueError):
        return None


def _gpu_failures(report: dict, request, per_program, memory_fraction) -> list[str]:
    name = report["run"]
    if report.get("status") != "ok":
        return [f"{name}: {report}"]
    failures = _lockdown_failures(name, report)
    if report.get("platform") != "gpu":
        failures.append(f"{name}: JAX runs on {report.get('platform')}, want gpu")
    want = per_program or (len(request.device_ids) or request.count)
    if want > 0 and len(report.get("device_kinds", [])) != want:
        failures.append(f"{name}: {len(report['device_kinds'])} devices, want {want}")
    if not report.get("matmul_right"):
        failures.append(f"{name}: wrong matmul result on the GPU")
    if memory_fraction is not None:
        if report.get("mem_fraction") != f"{memory_fraction:g}":
            failures.append(f"{name}: XLA_PYTHON_CLIENT_MEM_FRACTION={report.get('mem_fraction')}")
        total, limit = device_memory_bytes(), report.get("bytes_limit")
        if total and limit and limit > memory_fraction * total * 1.01:
            failures.append(
                f"{name}: JAX may take {limit} bytes, over {memory_fraction} of {total}"
            )
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default="1", help="1, 2, all, or device ids 'device=0,1'")
    parser.add_argument("--image", default=None, help="default: the CUDA variant's tag")
    parser.add_argument("--per-program", type=int, default=None, help="GPUs per program")
    parser.add_argument("--memory-fraction", type=float, default=None)
    parser.add_argument("--timeout-s", type=float, default=600.0)
    args = parser.parse_args(argv)
    reports, failures = check(
        gpus=args.gpus, image=args.image, per_program=args.per_program,
        memory_fraction=args.memory_fraction, timeout_s=args.timeout_s,
    )  # fmt: skip
    for report in reports:
        print(json.dumps(report))
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    print("GPU sandbox check:", "failed" if failures else "passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
