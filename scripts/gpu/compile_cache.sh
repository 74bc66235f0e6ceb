#!/usr/bin/env bash
# The shared compile cache measured on one GPU (run from the top of the workbook; $OUT collects the outputs):
# configs/optimized.yaml's first compiled step in three fresh processes: cold (an empty cache), warm (the cache
# that run filled) and warm from a read-only copy (its mega-cache files loaded into an empty per-user cache, as a
# learner on the hub gets it). python -m tutorial_lib warm --measure: tutorial_lib/lessons/warm.py.
#
#     OUT=/path/for/results bash scripts/gpu/compile_cache.sh    # one GPU: about 2-3 minutes on an H100/H200
#
# Writes notebooks/reference/04_compile_cache.json (commit it; docs/instructor.md shows it after
# python scripts/instructor_figures.py) and into $OUT: measure.json, the three runs' logs, reference.tgz.
set -euo pipefail
OUT=${OUT:-build/gpu/compile_cache}
export PYTHONUNBUFFERED=1
nvidia-smi -L | head -1
python3 -m tutorial_lib warm --measure --reference --out "$OUT"
tar czf "$OUT/reference.tgz" notebooks/reference/04_compile_cache.json
