#!/usr/bin/env bash
# Execute notebooks top to bottom on a GPU machine and record their reference figures
# (scripts/run_notebooks.py --reference): every `tl.reference.record(name, ...)` in a cell writes
# notebooks/reference/<name>.json (card, torch, date), and the fingerprint of the recording cells is stamped in,
# so tests/test_reference.py can tell when a notebook changed after its reference run. Needs Jupyter's kernel
# (the wheel kit of shared/gpu/README.md on the lent machines).
#
#     OUT=/path/for/results bash scripts/gpu/notebooks.sh notebooks/01_single_gpu.ipynb [...]
#     OUT=... WARM=1 bash scripts/gpu/notebooks.sh notebooks/06_scaling.ipynb   # the compile cache warmed first
#
# Writes $OUT/reference.tgz (notebooks/reference/*.json: unpack at the top of the workbook and commit) and
# $OUT/executed.tgz (the executed notebooks, to read the GPU outputs; not committed: the committed outputs are
# CPU runs) and $OUT/timings.json (each notebook's seconds and slowest cells on this machine: merge them into
# docs/notebook_timings_gpu.json). Takes what the notebooks take at full size: about 2-5 minutes each on an
# H100/H200.
set -euo pipefail
: "${OUT:?set OUT to the folder for the results}"
(( $# )) || { echo "usage: OUT=dir bash $0 notebooks/NN_name.ipynb ..." >&2; exit 2; }
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" KINETO_LOG_LEVEL=99 PYTHONUNBUFFERED=1
mkdir -p "$OUT" build/gpu-executed
# Compiled cells use the compile cache as on a workshop day (tutorial_lib/compilecache.py); WARM=1 fills it first
# (make warm's step, a few minutes on the first run), so that the timings are a warmed day's, as the plan wants.
export WORKBOOK_COMPILE_CACHE=${WORKBOOK_COMPILE_CACHE:-$PWD/build/compile-cache}
if [[ ${WARM:-0} == 1 ]]; then python3 -m tutorial_lib warm --out build/gpu-warm; fi
status=0
# --keep-going: one pass lists every failing cell; the GPU timings come back beside the results
python3 scripts/run_notebooks.py --reference --keep-going --timings "$OUT/timings.json" --out build/gpu-executed "$@" \
    || status=1
tar czf "$OUT/reference.tgz" notebooks/reference
tar czf "$OUT/executed.tgz" build/gpu-executed
exit $status
