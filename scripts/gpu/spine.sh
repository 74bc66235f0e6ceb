#!/usr/bin/env bash
# The spine on a GPU machine (run from the top of the workbook; $OUT collects the outputs): the CLI's first runs,
# fp32 and then bf16 + channels_last on one GPU, DDP through torchrun on 1 and 2 GPUs, in one table with DDP's
# weak-scaling efficiency (python -m tutorial_lib study spine: tutorial_lib/lessons/checks.py); then notebooks 00
# and 01 where Jupyter's kernel is installed.
#
#     OUT=/path/for/results bash scripts/gpu/spine.sh      # about 2 minutes
#     bash scripts/gpu/spine.sh --small                    # the CPU check of the same code (make test runs it)
#
# Writes $OUT/spine.json and $OUT/spine.md, and the executed notebooks under $OUT/notebooks.
set -euo pipefail
OUT=${OUT:-build/gpu/spine}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" KINETO_LOG_LEVEL=99 PYTHONUNBUFFERED=1  # the notebooks' kernel
if [[ ${1:-} == --small ]]; then exec python3 -m tutorial_lib study spine --small --out "$OUT"; fi
nvidia-smi -L
python3 -m tutorial_lib study spine --out "$OUT"
python3 scripts/run_notebooks.py --out "$OUT/notebooks" notebooks/00_setup.ipynb notebooks/01_single_gpu.ipynb \
    || echo "notebooks 00 and 01: not executed or FAILED (they need nbclient and ipykernel; see above)"
