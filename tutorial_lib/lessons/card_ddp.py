"""The card's DDP prediction beside a measurement (tl.card, lessons/card.py).

On a node with two or more GPUs the card trains its recommended configuration twice, each as the workbook's own
command line in a fresh process (lessons.cases, the runner of every GPU study): on one GPU, then as DDP on the GPUs
a study would use there (2 or 4), with the same batch per GPU. tl.scaling.efficiency divides the two (weak
scaling: N GPUs' samples/s over N times one GPU's), and the card prints it beside the efficiency it predicted.

The card's key ddp_gpus says how many: auto (the default: 2 or 4 on a node with that many GPUs, none on a node
with fewer than 2), 0 (never), or N (N processes; on a CPU they are gloo processes, which is how the tests run it).
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from . import card_report, cases, scaling
from ..config import TrainConfig, UserError
from ..meters import untimed_steps

ESTIMATE_S = {"cuda": 150.0, "cpu": 60.0}  # one training run, start-up and compilation included


def gpus_to_measure(value) -> tuple[int, str | None]:
    """How many GPUs to measure DDP on for the card key ddp_gpus=`value`, and why none when none."""
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if value is None or str(value).strip().lower() == "auto":
        if visible < 2:
            return 0, (f"not measured: this node has {visible} GPU{'s' * (visible != 1)}; on a node with 2 or more "
                       "the card trains its recommendation on 1 and on every GPU and prints the efficiency here")
        return cases.node_gpus(visible), None
    text = str(value).strip()
    if not text.isdigit() or int(text) == 1:
        raise UserError(f"ddp_gpus={value!r} must be auto, 0 (do not measure) or a number of processes of 2 or more")
    n = int(text)
    if n == 0:
        return 0, "not measured (ddp_gpus=0)"
    if visible and n > visible:
        raise UserError(f"ddp_gpus={n}: this node has {visible} GPUs; give ddp_gpus={visible} or fewer, or auto")
    return n, None


def measure(specs: dict, cfg: TrainConfig, gpus: int, why: str | None, sizes, out: Path) -> dict:
    """Train `cfg` (the recommended configuration) on one GPU and as DDP on `gpus`, each `sizes.steps` timed steps
    after the untimed ones, into <out>/ddp; the measured efficiency, or why there is none."""
    if not gpus:
        return {"why": why}
    args = card_report.train_args(specs)
    if args is None:
        return {"why": "not measured: the model or the batch was given as an object; name them as MODULE:FUNCTION "
                       "(a .py file or a module) so that fresh processes can build them"}
    warm = untimed_steps(cfg, sizes.warmup)
    base = cfg.replace(parallel="none", steps=warm + sizes.steps, timing_warmup=warm, log_every=warm + sizes.steps,
                       eval=False, tensorboard=False, ckpt_every=0)
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    estimate = ESTIMATE_S["cuda" if visible else "cpu"]
    runner = cases.Runner(out / "ddp", 3 * estimate, visible)
    started = time.perf_counter()
    runner.run(cases.Case("one_gpu", base, 1, "the recommendation on 1 GPU", command="card", args=tuple(args),
                          estimate_s=estimate))
    runner.run(cases.Case(f"ddp_{gpus}", base.replace(parallel="ddp"), gpus, f"the recommendation as DDP on {gpus}",
                          command="card", args=tuple(args), estimate_s=estimate))
    runner.save()
    wall_s = round(time.perf_counter() - started, 1)
    one, many = runner.result("one_gpu"), runner.result(f"ddp_{gpus}")
    if one is None or many is None:
        failed = next(r for r in runner.records.values() if r.get("result") is None)
        return {"why": f"not measured: {failed['about']} {failed['status']} (its output: {out / 'ddp' / 'cases.log'})",
                "wall_s": wall_s}
    point = scaling.efficiency(many, one, "weak")
    return {"why": None, "gpus": gpus, "unit": "GPUs" if visible else "CPU processes (gloo)",
            "efficiency": point.efficiency, "one_gpu_samples_s": one["throughput_img_s"],
            "ddp_samples_s": many["throughput_img_s"], "timed_steps": sizes.steps,
            "log": str(out / "ddp" / "cases.log"), "wall_s": wall_s}

