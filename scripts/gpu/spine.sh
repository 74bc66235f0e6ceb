#!/usr/bin/env bash
# The spine on a GPU machine (run from the repo root; $OUT collects the outputs):
# CLI fp32 vs bf16 + channels_last on one GPU, DDP on 1 and 2 GPUs through torchrun, notebooks 00 and 01.
set -uo pipefail
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 KINETO_LOG_LEVEL=99
OUT=${OUT:-build/gpu}; mkdir -p "$OUT"
nvidia-smi -L; python3 -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__)'
common="dataset=shapes model=resnet18 batch_size=256 num_workers=8 progress=false log_every=50 resume=false"
CUDA_VISIBLE_DEVICES=0 python3 -m tutorial_lib train $common steps=150 precision=fp32 out_dir=runs/gpu/fp32 | tail -1
CUDA_VISIBLE_DEVICES=0 python3 -m tutorial_lib train $common steps=300 precision=bf16 channels_last=true out_dir=runs/gpu/bf16 | tail -1
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  for n in 1 2; do
    OMP_NUM_THREADS=4 python3 -m torch.distributed.run --standalone --nproc_per_node=$n -m tutorial_lib train $common \
      steps=300 precision=bf16 channels_last=true parallel=ddp num_workers=6 out_dir=runs/gpu/ddp$n 2>&1 | grep -v "^W\|^\*" | tail -1
  done
fi
python3 - <<'PY'
import json, os
rows = []
for name in ("fp32", "bf16", "ddp1", "ddp2"):
    p = f"runs/gpu/{name}/result.json"
    if os.path.exists(p):
        r = json.load(open(p))
        rows.append((name, r["device"], r["world_size"], r["throughput_img_s"], r["step_time_ms"]["median"],
                     r["data_wait_ms"], r["peak_memory_mb"], r["val_accuracy"], len(set(r["param_checksums"])) == 1))
print(f"{'run':6s} {'device':28s} {'ws':>2s} {'img/s':>9s} {'step ms':>8s} {'wait ms':>8s} {'peak MB':>8s} {'acc':>6s} sync")
for n, d, ws, t, s, w, m, a, ok in rows:
    print(f"{n:6s} {d[:28]:28s} {ws:2d} {t:9,.0f} {s:8.1f} {w:8.2f} {m:8,.0f} {a:6.3f} {ok}")
if {"ddp1", "ddp2"} <= {r[0] for r in rows}:
    t = {r[0]: r[3] for r in rows}
    print(f"DDP weak-scaling efficiency 2 GPUs vs 1: {t['ddp2'] / (2 * t['ddp1']):.3f}")
json.dump(rows, open(os.path.join(os.environ.get("OUT", "build/gpu"), "spine_results.json"), "w"), indent=1)
PY
