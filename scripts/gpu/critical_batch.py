"""Notebook 06's large-batch question, on one GPU: how many more images does a larger global batch need to
reach the same validation accuracy, and with which learning-rate rule?

A global batch of G images trained on N GPUs (G/N each, gradients averaged) takes the same optimizer steps as
G images on one GPU; only BatchNorm differs (it normalises over each GPU's share). So one GPU can map the
images-to-target curve that decides time to accuracy on N GPUs: time = images to target / (N x img/s per GPU x
efficiency). If 4 x the batch needs k x the images, 4 GPUs can reach the target at most 4 / k times sooner.

The recipe is scripts/gpu/scaling.sh's time-to-accuracy recipe (shapes_hard, CIFAR-stem ResNet-18, bf16,
channels_last, loader=gpu_resident, the whole step as one CUDA graph, AdamW at lr 2e-3 for batch 256, constant
after a warm-up of 100,000 images), at global batches 256, 1024 and 4096, each with the rules none, sqrt and
linear (tutorial_lib.scaling.scaled_lr from batch 256). Every run sees the same number of images and is
evaluated every ~10,000 images; SEED1=1 repeats the runs at 256 and at 1024 with the sqrt rule with another seed,
to show the run-to-run spread.

    OUT=build/gpu/critical_batch python3 scripts/gpu/critical_batch.py     # one GPU, about 3-4 minutes
    SMALL=1 OUT=/tmp/cb python3 scripts/gpu/critical_batch.py              # CPU check, tiny sizes

Writes notebooks/reference/06_critical_batch.json (on a GPU; SMALL=1 writes it to $OUT only) and, in $OUT,
critical_batch.txt (the table) and critical_batch.log (every run's output).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import tutorial_lib as tl  # noqa: E402
from tutorial_lib import reference, scaling  # noqa: E402

SMALL = os.environ.get("SMALL") == "1"
OUT = Path(os.environ.get("OUT", "build/gpu/critical_batch"))
RUNS = Path("runs/gpu/critical_batch")
P = lambda small, full: small if SMALL else full  # noqa: E731
BASE_BATCH, BASE_LR = P(8, 256), 2e-3
BATCHES = P((8, 32), (256, 1024, 4096))
IMAGES = P(256, 409_600)  # every run sees this many training images
EVAL_IMAGES = P(64, 10_240)
WARMUP_IMAGES = P(64, 100_000)
TARGETS = (0.95, 0.97, 0.98, 0.99)
RECIPE = tl.TrainConfig(dataset="shapes_hard", model=P("resnet18_imagenet", "resnet18"), precision=P("fp32", "bf16"),
                        channels_last=P(False, True), loader="gpu_resident", device=P("cpu", "cuda"), num_workers=0,
                        tensorboard=False, progress=False, resume=False, lr=BASE_LR, lr_schedule="constant",
                        val_size=P(64, 5000), train_size=P(512, None), log_every=P(4, 100), timing_warmup=P(1, 10),
                        cuda_graph=not SMALL)


def config(batch: int, rule: str, seed: int) -> tl.TrainConfig:
    steps = IMAGES // batch
    return RECIPE.replace(batch_size=batch, seed=seed, steps=steps, eval_every=max(1, round(EVAL_IMAGES / batch)),
                          lr=scaling.scaled_lr(BASE_LR, BASE_BATCH, batch, rule),
                          warmup_steps=scaling.warmup_steps(WARMUP_IMAGES, batch),
                          out_dir=str(RUNS / f"b{batch}_{rule}_seed{seed}"))


def images_to(history: list, batch: int, target: float) -> int | None:
    """Training images seen when validation accuracy first reached `target` (val_history rows: step, s, acc)."""
    return next((step * batch for step, _, acc in history if acc >= target), None)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    cases = [(b, rule, 0) for b in BATCHES for rule in (("none",) if b == BASE_BATCH else scaling.LR_RULES)]
    if os.environ.get("SEED1"):
        cases += [(BASE_BATCH, "none", 1), (BATCHES[1], "sqrt", 1)]
    rows, log = [], open(OUT / "critical_batch.log", "w")
    t0 = time.time()
    for batch, rule, seed in cases:
        cfg = config(batch, rule, seed)
        words = [sys.executable, "-m", "tutorial_lib", "train", *cfg.to_overrides()]
        print(f"== batch {batch}, {rule} rule (lr {cfg.lr:.3g}), seed {seed} ({time.time() - t0:.0f} s)", flush=True)
        try:
            code = subprocess.run(words, stdout=log, stderr=subprocess.STDOUT, timeout=P(900, 150),
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"}).returncode
        except subprocess.TimeoutExpired:
            code = "timed out"
        if code != 0:
            rows.append(dict(batch=batch, rule=rule, seed=seed, lr=cfg.lr, status=f"failed ({code})"))
            continue
        r = scaling.as_dict(tl.load_result(cfg.out_dir))
        h = r["val_history"]
        rows.append(dict(batch=batch, rule=rule, seed=seed, lr=cfg.lr, warmup_steps=cfg.warmup_steps, steps=cfg.steps,
                         img_s=round(r["throughput_img_s"]), final_acc=h[-1][2] if h else None, history=h,
                         images_to={str(t): images_to(h, batch, t) for t in TARGETS}))
        print("   images to " + "  ".join(f"{t:.0%}: {rows[-1]['images_to'][str(t)] or '-'}" for t in TARGETS)
              + f"  | final {h[-1][2]:.3f}" if h else "   no validation", flush=True)
        save(rows, time.time() - t0)  # after every run: a run cut short by a time limit keeps what it measured
    print(table(rows))
    return 0


def save(rows: list, seconds: float) -> None:
    (OUT / "critical_batch.txt").write_text(table(rows) + "\n")
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() and not SMALL else "CPU (small mode)"
    figures = {"recipe": f"{RECIPE.dataset}, {RECIPE.model}, {RECIPE.precision}, AdamW lr {BASE_LR} at batch "
                         f"{BASE_BATCH}, warm-up {WARMUP_IMAGES} images, cuda_graph={RECIPE.cuda_graph}",
               "device": device, "base_batch": BASE_BATCH, "images": IMAGES, "targets": list(TARGETS), "runs": rows,
               "seconds": round(seconds)}
    if SMALL:
        reference.write("06_critical_batch", figures, script="scripts/gpu/critical_batch.py", card=device, gpus=1,
                        torch_version=torch.__version__, folder=OUT)
    else:
        (OUT / "06_critical_batch.json").write_text(json.dumps(figures, indent=1))
        reference.write("06_critical_batch", figures, script="scripts/gpu/critical_batch.py")


def table(rows: list) -> str:
    head = f"{'batch':>6s} {'rule':7s} {'seed':>4s} {'lr':>8s} {'img/s':>8s} " + " ".join(
        f"{'img to ' + format(t, '.0%'):>11s}" for t in TARGETS) + f" {'final':>6s}"
    lines = [head]
    for r in rows:
        if "status" in r:
            lines.append(f"{r['batch']:>6d} {r['rule']:7s} {r['seed']:>4d} {r['lr']:>8.3g}  {r['status']}")
            continue
        lines.append(f"{r['batch']:>6d} {r['rule']:7s} {r['seed']:>4d} {r['lr']:>8.3g} {r['img_s']:>8,d} " + " ".join(
            f"{(r['images_to'][str(t)] or 0):>11,d}" if r["images_to"][str(t)] else f"{'-':>11s}" for t in TARGETS)
            + f" {r['final_acc'] or 0:>6.3f}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
