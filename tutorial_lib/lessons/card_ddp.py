"""The card's DDP prediction beside a measurement (tl.card, lessons/card.py).

On a node with two or more GPUs the card trains its recommended configuration twice, each as the workbook's own
command line in a fresh process (lessons.cases, the runner of every GPU study): on one GPU, then as DDP on the GPUs
a study would use there (2 or 4), with the same batch per GPU. tl.scaling.efficiency divides the two (weak
scaling: N GPUs' samples/s over N times one GPU's), and the card prints it beside the efficiency it predicted.

The card's key ddp_gpus says how many: auto (the default: 2 or 4 on a node with that many GPUs, none on a node
with fewer than 2), 0 (never), or N (N processes; on a CPU they are gloo processes, which is how the tests run it).

On every node, one GPU included, the card also trains its recommendation as DDP in this one process (world size 1:
`one_process`): DDP's gradient hooks and buckets, and on a compiled model the graph cut at the buckets (with the whole
step as one CUDA graph: the engine's DDP by hand inside the graph), cost every GPU that much before any communication,
and the prediction counts it (allreduce.predict's ddp_step_ms; card_report.ddp_work says which on the page).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from . import allreduce, card_report, cases, ladder, noise, scaling
from ..config import TrainConfig, UserError
from ..values import count, is_whole
from ..meters import untimed_steps

ONE_PROCESS = ladder.Rung("ddp_one_process", "the recommendation as DDP in one process (world size 1)")

ESTIMATE_S = {"cuda": 150.0, "cpu": 60.0}  # one training run, start-up and compilation included


def gpus_to_measure(value) -> tuple[int, str | None]:
    """How many GPUs to measure DDP on for the card key ddp_gpus=`value`, and why none when none."""
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if value is None or str(value).strip().lower() == "auto":
        if visible < 2:
            return 0, (f"not measured: this node has {count(visible, 'GPU')}; on 2 or more the card measures its "
                       "recommendation on 1 GPU and on 2, or 4 where the node has 4")
        return cases.node_gpus(visible), None
    text = str(value).strip()
    if not is_whole(text) or int(text) == 1:
        raise UserError(f"ddp_gpus={value!r} must be auto, 0 (do not measure) or a number of processes of 2 or more")
    n = int(text)
    if n == 0:
        return 0, "not measured (ddp_gpus=0; without it the card measures DDP on 2 or 4 GPUs where the node has them)"
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


# ---------------------------------------------------------------------------------------- DDP in one process
def one_process(measure, rec: dict) -> dict:
    """The recommended configuration (rec, card.recommend's) trained as DDP in this process, rank 0 of 1, by
    `measure(cfg) -> row` (the card's rung measure, so the row is like for like with the recommendation's): its
    samples/s against the recommendation's, and whether the difference is beyond noise."""
    if dist.is_available() and dist.is_initialized() or "RANK" in os.environ:
        return {"why": "not measured: this process is already one rank of several (RANK is set); run the card alone"}
    cfg = rec["config"]
    with allreduce.environment(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(allreduce.free_port())):  # torchrun's, for one
        row = measure(cfg.replace(parallel="ddp", out_dir=str(Path(cfg.out_dir).parent / ONE_PROCESS.name)))
    if row.get("skipped"):
        return {"why": row["skipped"], "row": row}
    base, alone = ladder.figure(rec["row"]), ladder.figure(row)
    return {"why": None, "row": row, "factor": row["img_s"] / rec["row"]["img_s"],
            "relation": noise.relation(alone, base), "step_ms": 1000 * row["batch"] / row["img_s"]}


def predicted_step_ms(alone: dict, step_ms: float) -> float | None:
    """The step the prediction adds the all-reduce to: DDP's in one process, never faster than without DDP (a
    faster one is noise), or None when it was not measured."""
    return max(step_ms, alone["step_ms"]) if alone.get("why") is None else None
