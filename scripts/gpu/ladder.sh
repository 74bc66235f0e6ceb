#!/usr/bin/env bash
# Notebook 04 on one GPU (run from the top of the workbook; $OUT collects the outputs): the optimization ladder,
# every rung measured in one process on one card, the traces of its key rungs and notebook 03's bench at
# configs/optimized.yaml (python -m tutorial_lib study ladder: tutorial_lib/lessons/ladder.py), then
# docs/performance.md rendered again from the reference files.
#
#     OUT=/path/for/results bash scripts/gpu/ladder.sh     # one GPU: about 8 minutes on an H100/H200
#     bash scripts/gpu/ladder.sh --small                   # the CPU check of the same code (make test runs it)
#
# Rungs that would start after 5.5 minutes are skipped, and the bench when the ladder and its traces took more
# than 7.5, so that the whole script ends within 10. Writes notebooks/reference/04_ladder.json and
# 04_ladder_<card>.json and docs/performance.md (commit them), and into $OUT: ladder.md, ladder.json, the two
# records, and reference.tgz (the files to commit).
set -euo pipefail
OUT=${OUT:-build/gpu/ladder}
export KINETO_LOG_LEVEL=99 PYTHONUNBUFFERED=1
if [[ ${1:-} == --small ]]; then exec python3 -m tutorial_lib study ladder --small --out "$OUT"; fi
nvidia-smi -L | head -1
python3 -m tutorial_lib study ladder --reference --out "$OUT"
python3 -m tutorial_lib ladder --doc
tar czf "$OUT/reference.tgz" notebooks/reference/04_ladder*.json docs/performance.md
