#!/usr/bin/env bash
# Notebook 05's reference figures on a 4-GPU node (a 2-GPU node runs the cases that fit): DataParallel and DDP on
# 1, 2 and 4 GPUs, the cudnn.benchmark trap and DDP's knobs (tutorial_lib/lessons/dpddp.py says what each case
# is). About 5 minutes; writes notebooks/reference/05_dp_vs_ddp.json and, in $OUT, the cases, the log and the
# tables. The CPU check of the same code: bash scripts/gpu/dp_vs_ddp.sh --small
set -euo pipefail
OUT=${OUT:-build/gpu/dp_vs_ddp}
if [[ ${1:-} == --small ]]; then exec python3 -m tutorial_lib study dpddp --small --out "$OUT"; fi
nvidia-smi -L
exec python3 -m tutorial_lib study dpddp --reference --out "$OUT"
