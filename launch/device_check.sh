#!/usr/bin/env bash
# The first checks on a lent accelerator, in about 6 minutes on one H200 (<= 8):
# train-step MFU at Qwen3-1.7B and Qwen3.5-0.8B shapes (bf16, remat) with the
# memory plan against the allocator's peak, sampler tokens/s at batch 1/16/64
# against the memory-bandwidth bound, the chunked Gated DeltaNet kernel against
# its recurrent reference, then the GPU sandbox path. JSON results go to DIR
# (one file per check, summary.json, sandbox.json).
#
#   launch/device_check.sh DIR            # on a GPU machine
#   launch/device_check.sh DIR --quick    # tiny shapes: what a CPU can run
#
# Without a working nvidia-smi it runs the tiny shapes on the CPU and skips the
# sandbox check (recorded as skipped). PYTHON picks the interpreter (default:
# .venv/bin/python, else python3).
set -euo pipefail

if [ $# -lt 1 ]; then
  echo "usage: launch/device_check.sh DIR [--quick]" >&2
  exit 2
fi
out="$1"
shift
quick=""
if [ "${1:-}" = "--quick" ]; then quick="--quick"; fi
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
mkdir -p "$out"

gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then gpu=1; fi
if [ "$gpu" = 0 ]; then
  echo "device check: no GPU (nvidia-smi); tiny shapes on the CPU"
  quick="--quick"
else
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/nvidia_smi.csv"
fi

# On the GPU the checks stay within their share of the 8 minutes (a stuck one is
# killed); the tiny shapes on a CPU get longer, as a shared CPU may be slow.
limit=420
if [ -n "$quick" ]; then limit=1800; fi
timeout "$limit" "$PY" -m benchmarks.device_check --out "$out" $quick

if [ "$gpu" = 1 ]; then
  start=$(date +%s)
  status=ok
  timeout 300 launch/gpu_sandbox_check.sh > "$out/sandbox.log" 2>&1 || status=failed
  printf '{"status": "%s", "seconds": %d, "log": "sandbox.log"}\n' \
    "$status" "$(( $(date +%s) - start ))" > "$out/sandbox.json"
else
  echo '{"status": "skipped", "reason": "no GPU"}' > "$out/sandbox.json"
fi
echo "device check: results in $out"
