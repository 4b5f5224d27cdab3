#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py) through the real training entry point: DDP/FSDP, MFU
# with torch.compile at two batches, the token and JPEG loaders against what the GPU consumes,
# async checkpoints of a 1B model, the cost of telemetry and guards, launch -> first step,
# deterministic kill-and-resume and the ordinal check. It prints met or missed against each of
# issue 30's GPU targets and writes the "GPU check" section of BENCHMARKS.md (gpu_check.json
# and the section also to $OUT when set).
# Needs NVIDIA GPUs and a CUDA build of torch. Budget: under 8 minutes on one H200 (the script's
# pieces start only while their estimates fit in 440 s; the sum is in gpu_check.py's PIECE_S).
#   bash benchmarks/gpu_check.sh                     # everything
#   bash benchmarks/gpu_check.sh --only checkpoint   # one piece again; BENCHMARKS.md is left alone
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
exec timeout 480 "$PYTHON" benchmarks/gpu_check.py "$@"
