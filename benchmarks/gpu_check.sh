#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py): DDP/FSDP, bf16/TF32, compile, MFU, data wait, NVML,
# deterministic kill-and-resume and the ordinal check, through the real training entry point.
# Needs a machine with NVIDIA GPUs and a CUDA build of torch; writes the "GPU check" section of
# BENCHMARKS.md. Budget: under 8 minutes on one GPU (the script's default sizes).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
exec timeout 480 "$PYTHON" benchmarks/gpu_check.py "$@"
