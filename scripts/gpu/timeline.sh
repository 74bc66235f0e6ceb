#!/usr/bin/env bash
# The timeline of notebook 02 on one GPU ($OUT collects the outputs; run from the top of the workbook):
# python -m tutorial_lib study timeline (tutorial_lib/lessons/timeline.py) profiles notebook 02's run in fp32 and in
# bf16 + channels_last, keeps two steps of each as a timeline (host threads, GPU streams, idle share), and where
# Nsight Systems is installed runs the same run under nsys (the timed window only) and writes `nsys stats`.
#
#     OUT=/path/for/results bash scripts/gpu/timeline.sh   # about 1 minute on one H200
#     bash scripts/gpu/timeline.sh --small                 # the CPU check of the same code
#
# Writes under $OUT: 02_timeline.json (copy it to notebooks/reference/) and, where nsys exists,
# 02_nsys_stats.txt (copy it beside it); without nsys the record says so ("nsys": null) and the log too.
set -euo pipefail
OUT=${OUT:-build/gpu/timeline}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" KINETO_LOG_LEVEL=99 PYTHONUNBUFFERED=1
if [[ ${1:-} == --small ]]; then exec python3 -m tutorial_lib study timeline --small --out "$OUT"; fi
nvidia-smi -L
command -v nsys >/dev/null && nsys --version || echo "nsys: not installed here (the record will say so)"
python3 -m tutorial_lib study timeline --out "$OUT"
rm -rf "$OUT/runs"  # the runs and their traces: the record holds what the notebook reads
ls -l "$OUT"
