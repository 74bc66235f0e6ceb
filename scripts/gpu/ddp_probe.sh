#!/usr/bin/env bash
# Issue 11's question on a 4-GPU node (run from the repo root; $OUT collects the outputs): why does DDP with
# torch.compile lose half of every GPU at batch 256 per GPU, and does recording the whole step as one CUDA graph
# (cuda_graph=true: forward, backward, the flat gradient all-reduce and the optimizer, no DDP module) win it back?
# CIFAR-stem ResNet-18, bf16 + channels_last + loader=gpu_resident, the workbook CLI (`python -m tutorial_lib
# train`, under torchrun for DDP):
#   1 GPU  at batch 256 and 1024: cuda_graph + compile default, and compile reduce-overhead (the four at once,
#          one per GPU, each pinned to its own quarter of the CPUs)
#   DDP    cuda_graph at batch 256 per GPU on 4 GPUs; the same with ddp_sync=buckets (all-reduces during the
#          backward pass: at 256, 1024, bf16 gradients, rank 0's trace, 8 MB buckets, eager kernels, 2 GPUs); at 1024; with the gradients all-reduced in bf16
#          (ddp_grad_dtype=bf16) at 256 and 1024; on 2 GPUs; reduce-overhead with the flat all-reduce
#          (ddp_sync=flat); cuda_graph again with rank 0's trace; reduce-overhead with DDP's hooks
#          (ddp_compile=split: every rank's trace; whole); cuda_graph with eager kernels; eager DDP; cuda_graph
#          on 2 GPUs at 1024; hooks with ddp_compile=inner
# Cases run in that order (most telling first) until the time budget (PROBE_BUDGET s, default 330) would be
# exceeded; the rest are reported as skipped. About 6 minutes in all (PROBE_BUDGET=480: about 9).
# Writes to $OUT: ddp_probe.json (every case), ddp_probe.txt (the table), ddp_probe.log (every run's output),
# traces.txt (tl.trace_summary of each rank's trace), traces.tar.gz (the traces themselves), 05_ddp_probe.json (img/s and efficiency per case, a
# tl.reference file for notebook 05: copy it to notebooks/reference/).
# On a 2-GPU node the 1-GPU cases run two at once and the 4-GPU cases on 2 GPUs.
# A subset: PROBE_CASES=ddp_graph,ddp_graph_bf16grads (the 1-GPU cases always run); PROBE_REF=name writes the
# reference file under that name instead of 05_ddp_probe (so a subset does not replace the whole probe's).
# CPU test mode: CPU=1 bash scripts/gpu/ddp_probe.sh  (2 gloo processes, tiny sizes, every case; ~10 min on 2 cores)
set -uo pipefail
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 KINETO_LOG_LEVEL=99
export OUT=${OUT:-build/gpu/ddp_probe}; mkdir -p "$OUT"
PY=${PYTHON:-python3}
if [ "${CPU:-0}" = 0 ]; then nvidia-smi -L; nvidia-smi topo -m 2>/dev/null | head -8; fi
"$PY" -c 'import os, torch; print("torch", torch.__version__, "| CPUs:", len(os.sched_getaffinity(0)),
          "| GPUs:", torch.cuda.device_count())'
exec "$PY" scripts/gpu/ddp_probe.py
