#!/usr/bin/env bash
# Notebook 03 on a GPU (run from the repo root; $OUT collects the outputs): is the GPU waiting for data?
# CIFAR-stem ResNet-18, bf16 + channels_last, dataset=shapes (CIFAR's shape and size, no download):
# IO / SYNTHETIC / FULL of the CPU DataLoader (8 workers), the prefetcher, the imagefolder PNG files and
# loader=gpu_resident, at batch 256 and 1024; the CUDA cases of tests/test_data.py; a table at the end;
# with 2 GPUs also the bench under torchrun (every rank measures). Pass: every gpu_resident row reaches
# FULL >= 0.95 x SYNTHETIC. About 2-3 minutes.
set -uo pipefail
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 KINETO_LOG_LEVEL=99
export OUT=${OUT:-build/gpu}; mkdir -p "$OUT"
nvidia-smi -L
python3 -c 'import os, torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__,
            "| CPUs for this process:", len(os.sched_getaffinity(0)))'

echo "== CUDA cases of the data tests (GPU crop_flip = CPU crop_flip, prefetcher order, gpu_resident draws)"
if python3 -c 'import pytest' 2>/dev/null; then
    python3 -m pytest -q -p no:cacheprovider tests/test_data.py -k cuda 2>&1 | tail -3
else
    echo "no pytest here: skipped"
fi

echo "== imagefolder: 60,000 PNG files from the shapes generator"
start=$SECONDS
python3 -m tutorial_lib data fetch imagefolder --data-dir build/gpu-data
echo "written in $(( SECONDS - start )) s"

if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
    echo "== DDP on 2 GPUs, loader=gpu_resident, batch 256 per GPU: every rank measures, the job's figure is the slowest"
    OMP_NUM_THREADS=4 python3 -m torch.distributed.run --standalone --nproc_per_node=2 -m tutorial_lib bench \
        parallel=ddp loader=gpu_resident model=resnet18 precision=bf16 channels_last=true batch_size=256 \
        tensorboard=false out_dir=runs/gpu/03/ddp2 --steps 200 --window 20 2>&1 | grep -v "^W\|^\*"
    python3 -c 'import json; r = json.load(open("runs/gpu/03/ddp2/bench.json"))
print({m: [round(x) for x in f["per_rank_img_s"]] for m, f in r["figures"].items()}, "img/s per rank")'
fi

python3 - <<'PY'
import dataclasses, json, os, time

from tutorial_lib import TrainConfig, bench

base = TrainConfig(dataset="shapes", model="resnet18", precision="bf16", channels_last=True, num_workers=8,
                   tensorboard=False, progress=False, out_dir="runs/gpu/03")
cases = [  # name, overrides, timed steps, window
    ("b256 dataloader", dict(batch_size=256), 200, 20),
    ("b256 prefetcher", dict(batch_size=256, loader="prefetcher"), 200, 20),
    ("b256 imagefolder", dict(batch_size=256, dataset="imagefolder", data_dir="build/gpu-data"), 200, 20),
    ("b256 gpu_resident", dict(batch_size=256, loader="gpu_resident"), 200, 20),
    ("b1024 dataloader", dict(batch_size=1024), 60, 6),
    ("b1024 gpu_resident", dict(batch_size=1024, loader="gpu_resident"), 60, 6),
]
records = []
for name, kw, steps, window in cases:
    t0 = time.time()
    r = bench.bench(base.replace(out_dir=f"runs/gpu/03/{name.replace(' ', '_')}", **kw), steps=steps, window=window)
    print(f"-- {name} ({time.time() - t0:.0f} s)\n{r.summary()}", flush=True)
    records.append({"case": name, **dataclasses.asdict(r)})
json.dump(records, open(os.path.join(os.environ["OUT"], "data_loading.json"), "w"), indent=1)

device = records[0]["device"]
print(f"\nIO / SYNTHETIC / FULL in img/s on {device} (median of windows; spread of FULL in brackets)")
print(f"{'case':20s} {'IO':>10s} {'SYNTHETIC':>10s} {'FULL':>10s} {'FULL spread':>17s} {'FULL/SYN':>8s} "
      f"{'wait ms':>7s}  bound")
ok = True
for rec in records:
    f = {m: rec["figures"][m] for m in bench.MEASURES}
    ratio = f["full"]["img_s"] / f["synthetic"]["img_s"]
    spread = f"{f['full']['img_s_low']:,.0f}-{f['full']['img_s_high']:,.0f}"
    print(f"{rec['case']:20s} {f['io']['img_s']:10,.0f} {f['synthetic']['img_s']:10,.0f} {f['full']['img_s']:10,.0f} "
          f"{spread:>17s} {ratio:8.3f} {rec['full_data_wait_ms']:7.2f}  {rec['bound']}")
    if "gpu_resident" in rec["case"]:
        ok &= ratio >= 0.95
print("\n" + "\n".join(f"{rec['case']}: {rec['verdict']}" for rec in records))
print(f"\ngpu_resident FULL >= 0.95 x SYNTHETIC: {'PASS' if ok else 'FAIL'}")
PY
