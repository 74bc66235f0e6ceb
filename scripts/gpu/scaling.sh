#!/usr/bin/env bash
# Notebook 06 on one 4-GPU node (run from the repo root; $OUT collects the outputs). CIFAR-stem ResNet-18 in
# bf16 + channels_last with loader=gpu_resident, cuda_graph=true (the whole step, gradient all-reduce included,
# replayed as one CUDA graph), eager kernels (no compile: each launch would pay its compile time):
#   1. weak scaling 1/2/4 GPUs at batch 1024 per GPU (the bench: IO / SYNTHETIC / FULL on every rank)
#   2. the same 4-GPU run without gradient all-reduce (grad_sync=false): the gap is the communication
#   3. time to a target validation accuracy on shapes_hard at batch 256 per GPU: 1 GPU, then 4 GPUs with the
#      learning rate scaled linearly, by the square root, and not at all (AdamW, warm-up over the same images)
#   4. notebook 01's baseline (configs/baseline.yaml, fp32, batch 256, DataLoader) on one GPU: img/s and its
#      time to the same target (at most 2000 steps), for the headline and the wrong-baseline lesson
#   5. strong scaling at a global batch of 1024 (512 and 256 per GPU)
#   6. weak scaling and no-sync at batch 256 per GPU (a smaller local batch: communication weighs more)
# Writes notebooks/reference/06_scaling.json (tl.reference) and, in $OUT: 06_scaling.json, scaling.csv and
# scaling.md (the ledger of every result.json), runs.tgz (those files), scaling.log. About 6-7 minutes on
# 4x H100/H200; stages 5 and 6 are skipped after the 5th minute (the figures are written after each stage).
# The race with several seeds (each seed its own data, initialisation and order, the same on 1 and N GPUs):
#   STAGES=tta SEEDS=0,1,2,3 REF=06_tta_seeds bash scripts/gpu/scaling.sh
# runs every seed's 1-GPU run (at the same time, one per GPU), sets one target from all of them, then races
# seed by seed with each rule (RULES=linear,none,sqrt), until TTA_BUDGET s (default: no limit) have passed.
#
#     OUT=build/gpu/scaling bash scripts/gpu/scaling.sh          # on the GPU node
#     SMALL=1 OUT=build/gpu-small bash scripts/gpu/scaling.sh    # every stage on CPU: gloo, 2 processes, tiny
set -uo pipefail
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 KINETO_LOG_LEVEL=99
export OUT=${OUT:-build/gpu/scaling} SMALL=${SMALL:-0}
mkdir -p "$OUT"
[[ $SMALL == 1 ]] || nvidia-smi -L
python3 - 2>&1 <<'PY' | grep --line-buffered -v "^W[0-9]\|^\*\*\*\|OMP_NUM_THREADS" | tee "$OUT/scaling.log"
import json, os, shutil, subprocess, sys, tarfile, time, traceback
from pathlib import Path

import torch

import tutorial_lib as tl
from tutorial_lib import reference, scaling

SMALL, OUT, RUNS = os.environ["SMALL"] == "1", os.environ["OUT"], "runs/06_gpu"
STAGES = [x for x in os.environ.get("STAGES", "").split(",") if x]  # a subset of the stages, by name (default: all)
SEEDS = [int(x) for x in os.environ.get("SEEDS", "0").split(",")]  # the race's seeds
RULES = os.environ.get("RULES", "linear,sqrt,none").split(",")  # the race's learning-rate rules, in order
TTA_BUDGET = float(os.environ.get("TTA_BUDGET", "inf"))  # seconds after which no further race starts
REF = os.environ.get("REF", "06_scaling")  # the reference file's name
P = lambda small, full: small if SMALL else full  # noqa: E731
T0, BUDGET = time.time(), P(3600, 330)  # seconds after which the optional stages (5, 6) are skipped
CUDA = torch.cuda.is_available() and not SMALL
N = 2 if SMALL else min(4, torch.cuda.device_count())
COUNTS = [n for n in (1, 2, 4) if n <= N]
shutil.rmtree(RUNS, ignore_errors=True)
# every run in a fresh process: 1 GPU as `python -m tutorial_lib` on GPU 0 (no DDP), N through torchrun; on a
# CPU each of N processes gets usable_cpus / N threads (tl.launch), so the 1-process runs get the same
ONE = {**os.environ, "CUDA_VISIBLE_DEVICES": "0"} if CUDA else {
    **os.environ, "OMP_NUM_THREADS": str(max(1, tl.config.usable_cpus() // N))}
print(f"torch {torch.__version__} | {N} x {torch.cuda.get_device_name(0) if CUDA else 'CPU (small mode)'}")

B, B_SMALL = P(16, 1024), P(8, 256)  # batch per GPU: the recommended one, and a small one
base = tl.TrainConfig(dataset="shapes_hard", model=P("resnet18_imagenet", "resnet18"), precision=P("fp32", "bf16"),
                      channels_last=P(False, True), loader="gpu_resident", device=P("cpu", "auto"), num_workers=0,
                      tensorboard=False, progress=False, eval=False, resume=False, log_every=P(4, 50),
                      train_size=P(256, 16384), steps=P(8, 150), timing_warmup=P(2, 30), batch_size=B,
                      cuda_graph=True)  # the whole step, all-reduce included, as one CUDA graph (eager kernels)
BENCH = ("--steps", str(P(6, 60)), "--window", str(P(2, 10)))
figures = {"recipe": f"{base.model}, {base.precision}, channels_last={base.channels_last}, loader={base.loader}, "
                     f"eager kernels, the whole step as one CUDA graph (cuda_graph=true), dataset {base.dataset}", "batch_per_gpu": B, "gpus": N}


def elapsed():
    return time.time() - T0


def one_gpu_words(cfg, command="train", args=()):
    """The command line of a 1-GPU run: the workbook CLI, no DDP."""
    return [sys.executable, "-m", "tutorial_lib", command, *args, *cfg.replace(parallel="none").to_overrides()]


def run(label, cfg, n, bench=False):
    """Train (or bench) cfg on n processes: one without DDP, or DDP through torchrun; its result as a dict."""
    cfg = cfg.replace(out_dir=f"{RUNS}/{label}")
    command, args, t = "bench" if bench else "train", BENCH if bench else (), time.time()
    if n == 1:
        words = one_gpu_words(cfg, command, args)
        print("$ " + " ".join(words[1:]), flush=True)
        subprocess.run(words, env=ONE, check=True)
    else:
        tl.launch(cfg, nproc=n, command=command, args=args)
    r = tl.load_result(cfg.out_dir)
    print(f"-- {label}: {r.summary()} ({time.time() - t:.0f} s; {elapsed():.0f} s in all)", flush=True)
    return scaling.as_dict(r)


def run_ones(jobs):
    """1-GPU runs (label, cfg) at the same time, one per GPU (on a CPU: one after the other); their results."""
    if not CUDA or len(jobs) == 1:
        return [run(label, cfg, 1) for label, cfg in jobs]
    results = []
    for first in range(0, len(jobs), N):
        started = []
        for gpu, (label, cfg) in enumerate(jobs[first:first + N]):
            cfg = cfg.replace(out_dir=f"{RUNS}/{label}")
            words = one_gpu_words(cfg)
            print(f"$ CUDA_VISIBLE_DEVICES={gpu} " + " ".join(words[1:]), flush=True)
            os.makedirs(cfg.out_dir, exist_ok=True)
            log = open(f"{cfg.out_dir}/train.log", "w")
            started.append((label, cfg, log, subprocess.Popen(
                words, env={**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)}, stdout=log, stderr=subprocess.STDOUT)))
        for label, cfg, log, proc in started:
            proc.wait()
            log.close()
            if proc.returncode:
                print(open(log.name).read()[-3000:])
                raise RuntimeError(f"{label} failed (exit {proc.returncode}): its output above")
            r = tl.load_result(cfg.out_dir)
            print(f"-- {label}: {r.summary()} ({elapsed():.0f} s in all)", flush=True)
            results.append(scaling.as_dict(r))
    return results


def stage(name, fn):
    """Run one stage; a failure is reported and the next stage runs (the figures so far are kept)."""
    if STAGES and name not in STAGES:
        return
    if elapsed() > BUDGET and name not in ("weak", "nosync", "tta", "baseline"):
        print(f"== {name}: skipped ({elapsed():.0f} s > {BUDGET} s)")
        return
    print(f"== {name} ({elapsed():.0f} s in all)", flush=True)
    try:
        fn()
    except Exception:  # noqa: BLE001 - a GPU script reports and goes on
        traceback.print_exc()
        figures.setdefault("failed_stages", []).append(name)
    save()


def save():
    figures["seconds"] = round(elapsed())
    if SMALL:
        reference.write(REF, figures, script="scripts/gpu/scaling.sh", card="CPU (small mode)", gpus=N,
                        torch_version=torch.__version__, folder=OUT)
    else:
        shutil.copy(reference.write(REF, figures, script="scripts/gpu/scaling.sh"), OUT)


weak, tta_runs = {}, {}


def weak_scaling():  # 1. the bench on every rank, at the recommended batch per GPU
    for n in COUNTS:
        weak[n] = run(f"weak_b{B}_{n}gpu", base, n, bench=True)
        p = scaling.efficiency(weak[n], weak[1], "weak")
        bench = json.load(open(f"{RUNS}/weak_b{B}_{n}gpu/bench.json"))["figures"]
        figures[f"weak_{n}gpu_img_s"], figures[f"weak_{n}gpu_efficiency"] = round(p.img_s), round(p.efficiency, 3)
        for m, f in bench.items():
            figures[f"weak_{n}gpu_{m}_img_s"] = round(f["img_s"])
            figures[f"weak_{n}gpu_{m}_per_rank_img_s"] = [round(x) for x in f["per_rank_img_s"]]
        print(f"weak {n} GPU(s): {p.img_s:,.0f} img/s, efficiency {p.efficiency:.3f}")


def nosync():  # 2. the same N-GPU run without gradient all-reduce: the gap is the communication
    r = run(f"nosync_b{B}_{N}gpu", base.replace(grad_sync=False), N)
    figures[f"nosync_{N}gpu_img_s"] = round(r["throughput_img_s"])
    figures[f"nosync_{N}gpu_efficiency"] = round(r["throughput_img_s"] / (N * weak[1]["throughput_img_s"]), 3)
    figures["communication_share"] = round(1 - weak[N]["throughput_img_s"] / r["throughput_img_s"], 3)


# the race runs at the small batch per GPU: 4 x 1024 is past what shapes_hard can use (scripts/gpu/critical_batch.py:
# 4096 needs about twice the images of 1024 at any rate), 4 x 256 is not; 2e-3 is the base rate at 256
TTA = base.replace(batch_size=B_SMALL, train_size=P(512, None), val_size=P(128, 5000), lr=2e-3, lr_schedule="constant",
                   steps=P(24, 1600), eval_every=P(4, 40), timing_warmup=P(2, 10))
WARMUP_IMAGES = P(64, 100_000)


def time_to_accuracy():  # 3. 1 GPU sets the target; N GPUs with each learning-rate rule race to it
    many = len(SEEDS) > 1  # several seeds: labels carry the seed, and the spread is recorded
    name = lambda what, seed: f"{what}_seed{seed}" if many else what  # noqa: E731
    ones = run_ones([(name("tta_1gpu", s), scaling.lr_recipe(TTA, 1, TTA.batch_size, "none", WARMUP_IMAGES)
                      .replace(seed=s)) for s in SEEDS])
    last = [h[2] for one in ones for h in one["val_history"][-3:]]
    target = int(0.98 * sum(last) / len(last) * 200) / 200  # what 1 GPU holds at the end, less 2%, down to 0.5%
    tta_runs[1] = ones[0]
    figures.update(target_accuracy=target, tta_rule="98% of the mean of the 1-GPU run's last 3 validations"
                   + (" (every seed's)" if many else ""),
                   tta_1gpu_s=scaling.time_to_target(ones[0], target), tta_1gpu_history=ones[0]["val_history"],
                   tta_warmup_images=WARMUP_IMAGES, tta_base_lr=TTA.lr, tta_steps_1gpu=TTA.steps,
                   tta_batch_per_gpu=TTA.batch_size)
    seeds = figures["tta_seeds"] = {"seeds": SEEDS, "1gpu_s": [scaling.time_to_target(o, target) for o in ones]}
    print(f"target accuracy {100 * target:.1f}%: 1 GPU after {seeds['1gpu_s']} s (seeds {SEEDS})")
    for i, seed in enumerate(SEEDS):
        for rule in RULES:
            if elapsed() > TTA_BUDGET:
                print(f"race seed {seed}, {rule}: skipped ({elapsed():.0f} s > TTA_BUDGET {TTA_BUDGET:.0f} s)")
                seeds.setdefault(f"{rule}_s", ["skipped"] * len(SEEDS))
                continue
            cfg = scaling.lr_recipe(TTA, N, TTA.batch_size, rule, WARMUP_IMAGES).replace(
                steps=2 * TTA.steps // N, eval_every=max(1, TTA.eval_every // N), target_accuracy=target, seed=seed)
            r = run(name(f"tta_{N}gpu_{rule}", seed), cfg, N)
            seconds = scaling.time_to_target(r, target)
            seeds.setdefault(f"{rule}_s", ["skipped"] * len(SEEDS))[i] = seconds
            print(f"seed {seed}: {N} GPUs, {rule} rule (lr {cfg.lr:.2g}): {seconds} s to {100 * target:.1f}%")
            if i == 0:  # the first seed's race, as a single-seed run records it
                tta_runs[rule] = r
                figures[f"tta_{N}gpu_{rule}_s"], figures[f"tta_{N}gpu_{rule}_history"] = seconds, r["val_history"]
                figures[f"tta_{N}gpu_{rule}_lr"] = cfg.lr
                figures[f"tta_{N}gpu_{rule}_warmup_steps"] = cfg.warmup_steps
                if seconds and figures["tta_1gpu_s"]:
                    figures[f"tta_{N}gpu_{rule}_speedup"] = round(figures["tta_1gpu_s"] / seconds, 2)
            save()
    if many:
        print(scaling.race_table(seeds))


def strong_scaling():  # 5. the global batch stays B, split over the GPUs
    for n, cfg in scaling.strong_sweep(base, B, COUNTS[1:]):
        p = scaling.efficiency(run(f"strong_g{B}_{n}gpu", cfg, n), weak[1], "strong")
        figures[f"strong_{n}gpu_img_s"], figures[f"strong_{n}gpu_efficiency"] = round(p.img_s), round(p.efficiency, 3)
        figures[f"strong_{n}gpu_batch_per_gpu"] = p.batch_per_gpu


def small_batch():  # 6. a small batch per GPU: weak scaling and no-sync
    small = base.replace(batch_size=B_SMALL)
    one, many = run(f"weak_b{B_SMALL}_1gpu", small, 1), run(f"weak_b{B_SMALL}_{N}gpu", small, N)
    figures[f"weak_b{B_SMALL}_1gpu_img_s"], figures[f"weak_b{B_SMALL}_{N}gpu_img_s"] = (
        round(one["throughput_img_s"]), round(many["throughput_img_s"]))
    figures[f"weak_b{B_SMALL}_{N}gpu_efficiency"] = round(scaling.efficiency(many, one).efficiency, 3)
    ns = run(f"nosync_b{B_SMALL}_{N}gpu", small.replace(grad_sync=False), N)
    figures[f"nosync_b{B_SMALL}_{N}gpu_img_s"] = round(ns["throughput_img_s"])
    figures[f"nosync_b{B_SMALL}_{N}gpu_efficiency"] = round(ns["throughput_img_s"] / (N * one["throughput_img_s"]), 3)


def baseline():  # 4. notebook 01's baseline on one GPU: img/s, and its time to the same target (capped)
    target = figures["target_accuracy"]
    nb01 = tl.load("configs/baseline.yaml", dict(
        dataset="shapes_hard", device=base.device, tensorboard=False, progress=False, resume=False,
        lr_schedule="constant", val_size=TTA.val_size, train_size=TTA.train_size, model=base.model,
        steps=P(24, 2000), eval_every=P(4, 100), target_accuracy=target, log_every=P(4, 100)))
    if SMALL:
        nb01 = nb01.replace(batch_size=B_SMALL, num_workers=0)
    b = run("baseline_nb01", nb01, 1)
    best = min((r for k, r in tta_runs.items() if k != 1), key=lambda r: scaling.time_to_target(r, target) or 1e9)
    figures.update(baseline_img_s=round(b["throughput_img_s"] or 0) or None,  # None: the target came before a timed step
                   baseline_tta_s=scaling.time_to_target(b, target),
                   baseline_trained_s=b["val_history"][-1][1] if b["val_history"] else None,
                   baseline_batch=nb01.batch_size, baseline_precision=nb01.precision,
                   best_tta_s=scaling.time_to_target(best, target), best_lr=best["config"]["lr"])
    if b["throughput_img_s"]:  # 0 when it reached the target before its first timed step
        # the mistake of a wrong baseline: N GPUs in bf16 at batch B per GPU over 1 GPU in fp32 at batch 256
        figures["wrong_baseline_efficiency"] = round(weak[N]["throughput_img_s"] / (N * b["throughput_img_s"]), 2)
        figures["headline_img_s_ratio"] = round(weak[N]["throughput_img_s"] / b["throughput_img_s"], 1)


for name, fn in (("weak", weak_scaling), ("nosync", nosync), ("tta", time_to_accuracy), ("baseline", baseline),
                 ("strong", strong_scaling), ("small batch", small_batch)):
    stage(name, fn)

rows = scaling.ledger(RUNS)
scaling.write_csv(rows, f"{OUT}/scaling.csv")
open(f"{OUT}/scaling.md", "w").write(scaling.markdown_table(rows) + "\n")
with tarfile.open(f"{OUT}/runs.tgz", "w:gz") as tar:
    for name in ("result.json", "bench.json"):
        for path in sorted(Path(RUNS).rglob(name)):
            tar.add(str(path))
print(scaling.markdown_table(rows))
print(json.dumps({k: v for k, v in figures.items() if "history" not in k}, indent=1))
print(f"done in {elapsed():.0f} s")
PY
