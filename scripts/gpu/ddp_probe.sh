#!/usr/bin/env bash
# Issue 11's question on a 4-GPU node (run from the repo root; $OUT collects the outputs): why does DDP with
# torch.compile lose half of every GPU at batch 256 per GPU? CIFAR-stem ResNet-18, bf16 + channels_last +
# loader=gpu_resident, the workbook CLI (`python -m tutorial_lib train`, under torchrun for DDP):
#   1 GPU  at batch 256: eager, compile default, compile reduce-overhead; and reduce-overhead at batch 1024
#          (the four at once, one per GPU, each pinned to its own quarter of the CPUs)
#   4 GPUs at batch 256 per GPU, DDP, compile_mode=reduce-overhead unless named: ddp_compile=split (compile the
#          DDP module; Dynamo's DDPOptimizer cuts the graph at the buckets: today's engine; every rank's trace),
#          whole (no cuts: torch._dynamo.config.optimize_ddp=False; rank 0's trace: profile_ranks=0), inner
#          (compile, then wrap), eager; whole and split at batch 1024 per GPU; split with broadcast_buffers=false,
#          with bucket_cap_mb=100; split with compile default; whole with static_graph
# Cases run in that order (most telling first) until the time budget (PROBE_BUDGET s, default 330) would be
# exceeded; the rest are reported as skipped. About 6 minutes in all. Writes to $OUT: ddp_probe.json (every case),
# ddp_probe.txt (the table), ddp_probe.log (every run's output), traces.txt (tl.trace_summary of each rank's
# trace), traces.tar.gz (the traces themselves), 05_ddp_probe.json (img/s and efficiency per case, a
# tl.reference file for notebook 05: copy it to notebooks/reference/).
# CPU test mode: CPU=1 bash scripts/gpu/ddp_probe.sh  (2 gloo processes, tiny sizes, every case; ~10 min on 2 cores)
set -uo pipefail
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 KINETO_LOG_LEVEL=99
export OUT=${OUT:-build/gpu/ddp_probe}; mkdir -p "$OUT"
PY=${PYTHON:-python3}
if [ "${CPU:-0}" = 0 ]; then nvidia-smi -L; nvidia-smi topo -m 2>/dev/null | head -8; fi
"$PY" -c 'import os, torch; print("torch", torch.__version__, "| CPUs:", len(os.sched_getaffinity(0)),
          "| GPUs:", torch.cuda.device_count())'
exec "$PY" scripts/gpu/ddp_probe.py
