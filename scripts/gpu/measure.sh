#!/usr/bin/env bash
# One way to measure, checked on a GPU (run from the repo root; $OUT collects the outputs):
#  1. the same loader-bound run (1 DataLoader worker, batch 256, bf16 ResNet-18) trained and benched: train's
#     throughput_img_s and bench's FULL agree; the mean-based figure beside batch / median step; data wait;
#  2. TensorBoard's perf/img_per_s (the device's rate per log interval) beside the run's throughput;
#  3. a profiled run (2 cycles) emits no "Profiler clears events" warning;
#  4. the bench verdict of notebook 03's loader=gpu_resident row and of 8 workers (host/launch-bound?).
# Writes $OUT/measure.json and, on a GPU, notebooks/reference/measure.json (tl.reference).
# About 2 minutes on an H100/H200. CPU=1 PY=.venv/bin/python runs every step with tiny sizes on the CPU
# (no reference file written).
set -euo pipefail
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 KINETO_LOG_LEVEL=99
export OUT=${OUT:-build/gpu}; mkdir -p "$OUT"
command -v nvidia-smi >/dev/null && nvidia-smi -L || echo "no nvidia-smi"
PY=${PY:-python3}

"$PY" - <<'PY'
import json, os, statistics, time, warnings

import torch

from tutorial_lib import TrainConfig, bench, engine, reference

cpu = os.environ.get("CPU") == "1" or not torch.cuda.is_available()
size = (lambda small, full: small) if cpu else (lambda small, full: full)
base = TrainConfig(dataset="shapes", model=size("resnet18_imagenet", "resnet18"), precision="bf16",
                   channels_last=True, batch_size=size(16, 256), train_size=size(512, None), eval=False,
                   progress=False, resume=False, timing_warmup=size(2, 20), log_every=size(4, 20),
                   device=size("cpu", "auto"))
steps = size(20, 220)
figures = {}

print("== 1. train and bench on the same loader-bound run (1 worker)", flush=True)
slow = base.replace(num_workers=1, steps=steps, tensorboard=True, out_dir="runs/gpu/measure/train")
t0 = time.time()
r = engine.train(slow)
b = bench.bench(slow.replace(tensorboard=False, out_dir="runs/gpu/measure/bench"), steps=steps - slow.timing_warmup,
                window=size(6, 20), measures=("full",))
t = r.step_time_ms
figures["loader_bound"] = {
    "train_img_s": r.throughput_img_s, "bench_full_img_s": b.img_s("full"),
    "bench_full_windows": [b.figures["full"].img_s_low, b.figures["full"].img_s_high],
    "by_median_img_s": r.global_batch / (t["median"] / 1000), "step_ms": {k: t[k] for k in ("mean", "median", "p10", "p90")},
    "data_wait_ms": r.data_wait_ms, "data_wait_fraction": r.data_wait_fraction, "batch_size": slow.batch_size}
print(r.summary(), f"\n{b.summary()}\n({time.time() - t0:.0f} s)", flush=True)

print("== 2. TensorBoard perf/img_per_s (device rate per interval)", flush=True)
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

events = EventAccumulator("runs/gpu/measure/train/tb").Reload()
rates = [e.value for e in events.Scalars("perf/img_per_s")]
figures["tensorboard"] = {"median_img_per_s": statistics.median(rates), "points": len(rates),
                          "run_img_s": r.throughput_img_s}
print(f"perf/img_per_s: median {statistics.median(rates):,.0f} over {len(rates)} points; run {r.throughput_img_s:,.0f} img/s")

print("== 3. profiling, 2 cycles: warnings", flush=True)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    engine.train(base.replace(num_workers=2, steps=12, profile=True, profile_repeat=2, profile_wait=1,
                              profile_warmup=1, profile_active=2, tensorboard=True, out_dir="runs/gpu/measure/prof"))
profiler_warnings = [str(w.message) for w in caught if "Profiler clears events" in str(w.message)]
figures["profiler_clears_events_warnings"] = len(profiler_warnings)
print("profiler warnings:", profiler_warnings or "none")

print("== 4. bench verdicts", flush=True)
figures["verdicts"] = {}
for name, kw in (("gpu_resident", dict(loader="gpu_resident")), ("8 workers", dict(num_workers=size(1, 8)))):
    v = bench.bench(base.replace(out_dir=f"runs/gpu/measure/{name.replace(' ', '_')}", tensorboard=False, **kw),
                    steps=size(12, 200), window=size(4, 20))
    print(f"-- {name}\n{v.summary()}", flush=True)
    figures["verdicts"][name] = {"bound": v.bound, "verdict": v.verdict,
                                 **{m: v.img_s(m) for m in bench.MEASURES}}

json.dump({"device": r.device, "torch": torch.__version__, "figures": figures},
          open(os.path.join(os.environ["OUT"], "measure.json"), "w"), indent=1)
if not cpu:
    print("wrote", reference.write("measure", figures, script="scripts/gpu/measure.sh"))
agree = abs(b.img_s("full") / r.throughput_img_s - 1)
print(f"train vs bench FULL: {100 * agree:.1f}% apart; profiler warnings: {len(profiler_warnings)}")
PY
