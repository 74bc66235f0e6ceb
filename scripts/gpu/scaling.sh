#!/usr/bin/env bash
# Notebook 06's reference figures on a 4-GPU node: weak and strong scaling, notebook 01's baseline, the race to a
# target accuracy (one GPU trains for more than a minute) and the all-reduce's cost from the traces of every rank
# (tutorial_lib/lessons/scaling_study.py). About 13 minutes of a 4x H200 in all; one call stops at its budget
# (440 s, for a device's 10-minute calls) and prints the command that runs the cases left (`--only`, merged into
# the record): on 4x H200 the first call ran the weak, traced, baseline and strong points (280 s), two more the
# race. Writes notebooks/reference/06_scaling.json and, in $OUT, every run's record, the log and
# 06_scaling.partial.json after each stage. CPU check: ... --small
set -euo pipefail
OUT=${OUT:-build/gpu/scaling}
if [[ ${1:-} == --small ]]; then exec python3 -m tutorial_lib study scaling --small --out "$OUT"; fi
nvidia-smi -L
exec python3 -m tutorial_lib study scaling --reference --out "$OUT"
