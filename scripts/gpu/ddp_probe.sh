#!/usr/bin/env bash
# Notebook 05's case study on a 4-GPU node: DDP at batch 256 per GPU form by form, and the whole-step graph traced
# on one GPU and on every rank (tutorial_lib/lessons/ddp_probe.py). About 6 minutes; writes
# notebooks/reference/05_ddp_probe.json and, in $OUT, the cases and their log. CPU check: ... --small
set -euo pipefail
OUT=${OUT:-build/gpu/ddp_probe}
if [[ ${1:-} == --small ]]; then exec python3 -m tutorial_lib study ddp_probe --small --out "$OUT"; fi
nvidia-smi -L
exec python3 -m tutorial_lib study ddp_probe --reference --out "$OUT"
