#!/usr/bin/env bash
# The workshop pre-flight (python -m tutorial_lib doctor) on a GPU machine, run from the top of the workbook; $OUT
# collects the outputs. Exercises every GPU check: GPUs and MIG slices, the driver against torch's CUDA, bf16, and
# with 2+ GPUs a real NCCL all-reduce (correctness, and the bandwidth of a 64 MiB all-reduce). About 30-60 s.
# Jupyter, Slurm and the lock's exact versions are absent on the lent GPU machines: those lines WARN, SKIP or
# FAIL there, which is expected and not recorded (the exit code is then 1).
#
#     OUT=/path/for/results bash scripts/gpu/doctor.sh
#     python -m tutorial_lib doctor --out /tmp/doctor        # anywhere (no --reference): the record names the card
#                                                            # it found, or none
#
# Writes $OUT/doctor.json (every check, its seconds), $OUT/doctor.txt (the table as an instructor sees it),
# $OUT/reference/doctor.json and notebooks/reference/doctor.json (the GPU checks' lines as a reference record:
# commit it, then python scripts/instructor_figures.py).
set -uo pipefail
OUT=${OUT:-build/gpu/doctor}
export PYTHONUNBUFFERED=1
nvidia-smi -L
timeout 300 python3 -m tutorial_lib doctor --out "$OUT" --reference
echo "doctor exit code $? (1: some check FAILs; the table says which)"
