#!/usr/bin/env bash
# Notebook 05 on a 4-GPU node (run from the repo root; $OUT collects the outputs): DataParallel vs DDP, measured.
# CIFAR-stem ResNet-18, bf16 + channels_last + loader=gpu_resident, batch 256 per GPU, the workbook CLI:
#   1 GPU: eager and compiled (reduce-overhead) at batch 256 and 1024 (four at once, one per GPU)
#   DataParallel on 4 and 2 GPUs (its one process gets batch 256 x GPUs), with an nvidia-smi monitor (utilisation
#     and memory per GPU) and a trace that cuts its step into scatter, replicate, forward, gather, backward...;
#     on 4 GPUs with cudnn.benchmark forced on (the trap the engine avoids)
#   DDP eager on 4 (per-rank traces: NCCL calls per step, communication not hidden) and 2 GPUs; DDP compiled
#     (the engine's default ddp_compile) on 4 and 2 GPUs and at batch 1024 on 4
#   DDP knobs on 4 GPUs, eager: bucket_cap_mb 1 and 100, broadcast_buffers, gradient_as_bucket_view,
#     static_graph, grad_accum_steps=4 (no_sync), sync_batchnorm
# Cases run in that order until the budget (BUDGET s, default 450) would be exceeded; the rest are reported
# as skipped. About 8 minutes. Writes notebooks/reference/05_dp_vs_ddp.json (tl.reference.write) and, in
# $OUT: 05_dp_vs_ddp.json (the same file), dp_vs_ddp.txt (the table), dp_vs_ddp.json (every case),
# dp_vs_ddp.log (every run's output), traces.txt (tl.trace_summary of DDP's per-rank traces).
# CPU test mode: CPU=1 bash scripts/gpu/dp_vs_ddp.sh  (2 gloo processes, tiny sizes; the reference file goes to
# $OUT only, marked as a CPU test)
set -uo pipefail
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 KINETO_LOG_LEVEL=99
export OUT=${OUT:-build/gpu/dp_vs_ddp}; mkdir -p "$OUT"
PY=${PYTHON:-python3}
if [ "${CPU:-0}" = 0 ]; then nvidia-smi -L; fi
"$PY" -c 'import os, torch; print("torch", torch.__version__, "| CPUs:", len(os.sched_getaffinity(0)),
          "| GPUs:", torch.cuda.device_count())'
exec "$PY" scripts/gpu/dp_vs_ddp.py
