#!/usr/bin/env bash
# Profiling on a GPU machine (notebook 02; run from the top of the workbook, 1-2 GPUs; $OUT collects the outputs):
# python -m tutorial_lib study traces (tutorial_lib/lessons/traces.py) records the GPU trace fixture of
# tests/test_profiling.py, profiles the fp32 baseline and the bf16 + channels_last run of one GPU and a 2-GPU DDP
# run (one trace per rank), checks their offline summaries and prints a table; then notebook 02 is executed where
# Jupyter's kernel is installed (the lent machines have none unless shared/gpu's kit is).
#
#     OUT=/path/for/results bash scripts/gpu/profiling.sh   # about 2 minutes
#     bash scripts/gpu/profiling.sh --small                 # the CPU check of the same code (make test runs it)
#
# Writes under $OUT: fixtures/gpu_resnet18_bf16.pt.trace.json.gz (commit it as
# tests/fixtures/gpu_resnet18_bf16.pt.trace.json.gz), figures/baseline_fp32.png, figures/ddp_2ranks.png,
# traces.json, traces.md, and notebooks/02_profiling.ipynb (executed, where it can run).
set -euo pipefail
OUT=${OUT:-build/gpu/profiling}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" KINETO_LOG_LEVEL=99 PYTHONUNBUFFERED=1  # the notebook's kernel
if [[ ${1:-} == --small ]]; then exec python3 -m tutorial_lib study traces --small --out "$OUT"; fi
nvidia-smi -L
python3 -m tutorial_lib study traces --out "$OUT"
python3 scripts/run_notebooks.py --out "$OUT/notebooks" notebooks/02_profiling.ipynb \
    || echo "notebook 02: not executed or FAILED (it needs nbclient, ipykernel and line_profiler; see above)"
