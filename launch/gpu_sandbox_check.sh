#!/usr/bin/env bash
# Check GPU sandboxes on a machine with NVIDIA GPUs: build the CUDA sandbox
# image, then run programs in DockerExecutor containers with GPUs and check
# that JAX sees them, that the lockdown holds, and that a run without GPUs
# gets none. Needs root (the image build), the NVIDIA driver, and the NVIDIA
# Container Toolkit (its nvidia-container-runtime-hook on the engine's PATH).
#
#   launch/gpu_sandbox_check.sh                          # 1 GPU per program
#   launch/gpu_sandbox_check.sh --gpus=2 --per-program=1 --memory-fraction=0.5
#
# Arguments go to `python -m wmrl_jax.sandbox.gpu_check`. PYTHON picks the
# interpreter (default: .venv/bin/python, else python3). Exit status 0 when
# every check passed.
set -euo pipefail

cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L; then
  echo "gpu sandbox check: no working nvidia-smi; this check needs a GPU machine" >&2
  exit 1
fi
if ! command -v nvidia-container-runtime-hook >/dev/null 2>&1; then
  echo "gpu sandbox check: nvidia-container-runtime-hook is not on PATH; the engine will" \
    "refuse GPU requests (install nvidia-container-toolkit, then restart the engine)" >&2
fi
launch/docker_engine.sh start
echo "engine runtimes: $(docker info --format '{{json .Runtimes}}')"

start=$(date +%s)
"$PY" -m wmrl_jax.sandbox.image --variant=cuda
echo "image ready after $(( $(date +%s) - start )) s"
"$PY" -m wmrl_jax.sandbox.gpu_check "$@"
