#!/usr/bin/env bash
# What a cluster user asks next, checked on a GPU node with 2 or more GPUs (run from the top of the workbook):
# the energy counter against power.draw, the hang drill on NCCL, CPU binding. tutorial_lib/lessons/cluster.py.
#
#     bash scripts/gpu/cluster.sh      # about 6 minutes; writes notebooks/reference/06_cluster_checks.json
#
# Then python -m tutorial_lib ladder --doc renders it into docs/performance.md (commit both).
set -euo pipefail
nvidia-smi -L
python3 -m tutorial_lib study cluster --reference --out "${OUT:-build/gpu/cluster}"
