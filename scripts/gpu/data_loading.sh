#!/usr/bin/env bash
# Notebook 03 on a GPU (run from the top of the workbook; $OUT collects the outputs): is the GPU waiting for data?
# The CUDA cases of tests/test_data.py, then python -m tutorial_lib study data_loading
# (tutorial_lib/lessons/data_loading.py): IO / SYNTHETIC / FULL of the CPU DataLoader (8 workers), the
# prefetcher, the imagefolder PNG files (written into data/ first if not staged) and loader=gpu_resident, at
# batch 256 and 1024, and with 2 GPUs the bench under torchrun (every rank measures). Pass: every gpu_resident
# row reaches FULL >= 0.95 x SYNTHETIC (the table's last line). About 3 minutes.
#
#     OUT=/path/for/results bash scripts/gpu/data_loading.sh
#     bash scripts/gpu/data_loading.sh --small              # the CPU check of the same code (make test runs it)
#
# Writes $OUT/data_loading.json (every bench) and $OUT/data_loading.md (the table); $OUT defaults to build/gpu/data_loading.
set -euo pipefail
OUT=${OUT:-build/gpu/data_loading}
export KINETO_LOG_LEVEL=99 PYTHONUNBUFFERED=1
if [[ ${1:-} == --small ]]; then exec python3 -m tutorial_lib study data_loading --small --out "$OUT"; fi
nvidia-smi -L
echo "== CUDA cases of the data tests (GPU crop_flip = CPU crop_flip, prefetcher order, gpu_resident draws)"
python3 -m pytest -q -p no:cacheprovider tests/test_data.py -k cuda || echo "(no pytest here, or a case failed: above)"
exec python3 -m tutorial_lib study data_loading --out "$OUT"
