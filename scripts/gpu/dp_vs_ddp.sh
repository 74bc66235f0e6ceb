#!/usr/bin/env bash
# Notebook 05 on a 4-GPU node (run from the repo root; $OUT collects the outputs): DataParallel vs DDP, measured.
# CIFAR-stem ResNet-18, bf16 + channels_last + loader=gpu_resident, batch 256 per GPU, the workbook CLI:
#   1 GPU: eager and compiled (reduce-overhead: CUDA graphs) at batch 256 and 1024 (four at once, one per GPU)
#   4 GPUs, one after the other: DDP compiled with the engine's defaults (ddp_sync=auto: one flat all-reduce
#     after the backward pass; rank 0's trace) at batch 256 and 1024; DataParallel (its one process gets batch
#     256 x GPUs; a trace cuts its step into scatter, replicate, forward, gather, backward...); DDP eager (every
#     rank's trace: all-reduce calls per step, communication not hidden); DDP compiled as before the fix
#     (ddp_sync=hooks, ddp_compile=split); DataParallel with cudnn.benchmark forced on (the trap the engine
#     avoids). An nvidia-smi monitor gives utilisation and memory per GPU.
#   2 GPUs, two cases at once (GPUs 0-1 and 2-3): DataParallel and DDP eager, DDP compiled, and DDP's knobs
#     (eager): grad_accum_steps=4 (no_sync), sync_batchnorm, bucket_cap_mb 1 and 100, broadcast_buffers=false,
#     gradient_as_bucket_view=false, static_graph
# On a 2-GPU node (or KNOBS_ONLY=1): the 1-GPU eager and compiled cases, then DataParallel (traced: its step
# decomposed) and the 2-GPU cases one at a time. REF=name writes the reference file under that name.
# Cases run in that order until the budget (BUDGET s, default 430) would be exceeded; the rest are reported
# as skipped. ONLY=case,case runs those cases alone (after the 1-GPU ones; 4-GPU nodes). About 8 minutes.
# Writes notebooks/reference/05_dp_vs_ddp.json (tl.reference.write) and, in
# $OUT: 05_dp_vs_ddp.json (the same file), dp_vs_ddp.txt (the table), dp_vs_ddp.json (every case),
# dp_vs_ddp.log (every run's output), traces.txt (tl.trace_summary of the DDP traces).
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
