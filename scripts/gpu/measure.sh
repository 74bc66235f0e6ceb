#!/usr/bin/env bash
# One way to measure, checked on a GPU (run from the top of the workbook; $OUT collects the outputs):
# python -m tutorial_lib study measure (tutorial_lib/lessons/checks.py):
#  1. the same loader-bound run (1 DataLoader worker, batch 256, bf16 ResNet-18) trained and benched: train's
#     throughput_img_s and bench's FULL agree; the mean-based figure beside batch / median step; data wait;
#  2. TensorBoard's perf/img_per_s (the device's rate per log interval) beside the run's throughput;
#  3. a profiled run (2 cycles) emits no "Profiler clears events" warning;
#  4. the bench verdict of loader=gpu_resident and of 8 workers (host/launch-bound?).
#
#     OUT=/path/for/results bash scripts/gpu/measure.sh    # about 2 minutes on an H100/H200
#     bash scripts/gpu/measure.sh --small                  # the CPU check of the same code (make test runs it)
#
# Writes notebooks/reference/measure.json and $OUT/measure.json (the same record).
set -euo pipefail
OUT=${OUT:-build/gpu/measure}
export KINETO_LOG_LEVEL=99 PYTHONUNBUFFERED=1
if [[ ${1:-} == --small ]]; then exec python3 -m tutorial_lib study measure --small --out "$OUT"; fi
nvidia-smi -L
exec python3 -m tutorial_lib study measure --reference --out "$OUT"
