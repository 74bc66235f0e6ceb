"""Scaling studies (notebook 06): weak and strong sweeps, speedup and efficiency against the right baseline,
learning-rate rules for a larger global batch, time to a target accuracy, and a ledger of result.json files.

    points = tl.scaling.weak_sweep(cfg, gpus=(1, 2, 4))        # [(gpus, config)]: the batch per GPU fixed
    rows = tl.scaling.ledger("runs/06_scaling")                # every result.json under a folder
    tl.scaling.efficiency(rows[2], rows[0])                    # refuses a baseline that differs per GPU
    tl.scaling.scaled_lr(2e-3, 1024, 4096, "sqrt")             # 4e-3
    tl.scaling.write_jobs(cfg, gpus=(1, 2, 4), nodes=2)        # jobs/06_scaling_*gpu.sbatch, 06_multinode

Weak scaling keeps the batch per GPU: N GPUs do N times the work per step, ideally in the same time.
Strong scaling keeps the global batch: N GPUs share the same work, ideally N times faster. Either way the
baseline is the best single-GPU run (no DDP wrapper) of the same per-GPU configuration: the same model,
data, precision, memory layout, compilation, input pipeline and batch (per GPU for weak, global for strong)
on the same card. Anything else measures that difference too (a baseline in fp32 at batch 256 against DDP
in bf16 at batch 1024 per GPU "scales" at hundreds of percent). No torch here: results are read on login nodes.
"""
from __future__ import annotations

import csv
import json
import math
import os
import statistics
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path

from ..config import TrainConfig, UserError

KINDS = ("weak", "strong")
LR_RULES = ("none", "linear", "sqrt")
# What a run and its baseline must share: everything that changes the work of one GPU in one step.
HELD_FIXED = ("dataset", "model", "optimizer", "precision", "channels_last", "compile", "compile_mode", "cuda_graph",
              "loader", "augment", "num_workers", "pin_memory", "cudnn_benchmark", "train_size")
LEDGER_COLUMNS = ("run", "device", "gpus", "batch_per_gpu", "global_batch", "precision", "grad_sync",
                  "throughput_img_s", "step_ms", "val_accuracy", "steps", "lr", "warmup_steps", "seconds")


# ---------------------------------------------------------------------------------------- sweeps
def weak_sweep(cfg: TrainConfig, gpus=(1, 2, 4)) -> list[tuple[int, TrainConfig]]:
    """Weak scaling: the batch per GPU stays cfg.batch_size; the global batch grows with the GPUs."""
    return [(n, cfg.replace(global_batch_size=None, parallel="ddp" if n > 1 else "none")) for n in _counts(gpus)]


def strong_sweep(cfg: TrainConfig, global_batch: int, gpus=(1, 2, 4)) -> list[tuple[int, TrainConfig]]:
    """Strong scaling: the global batch stays `global_batch`, split over the GPUs (each gets less)."""
    out = []
    for n in _counts(gpus):
        if global_batch % n:
            raise UserError(f"global_batch={global_batch} does not split over {n} GPUs; choose a multiple of "
                            f"{math.lcm(*_counts(gpus))}")
        out.append((n, cfg.replace(batch_size=global_batch // n, global_batch_size=None,
                                   parallel="ddp" if n > 1 else "none")))
    return out


def _counts(gpus) -> list[int]:
    counts = list(gpus)
    if not counts or any(not isinstance(n, int) or n < 1 for n in counts):
        raise UserError(f"gpus={gpus!r}: give GPU counts as positive whole numbers, e.g. (1, 2, 4)")
    return counts


# ---------------------------------------------------------------------------------------- efficiency
@dataclass
class Point:
    """One run of a sweep against its baseline."""
    gpus: int
    batch_per_gpu: int
    global_batch: int
    img_s: float
    speedup: float  # img/s over the baseline's (weak: ideal N; strong: ideal N)
    efficiency: float  # speedup / N: 1.0 is perfect
    device: str


def as_dict(result) -> dict:
    """A result as a dict: a Result, a result.json dict, or the path of a run folder."""
    if is_dataclass(result):
        return asdict(result)
    if isinstance(result, (str, os.PathLike)):
        return json.loads((Path(result) / "result.json").read_text())
    return result


def batch_per_gpu(result) -> int:
    r = as_dict(result)
    return r["global_batch"] // r["world_size"]


def check_baseline(run, baseline, kind: str = "weak") -> None:
    """Raise UserError naming the first thing `baseline` does not hold fixed for `run`."""
    run, base = as_dict(run), as_dict(baseline)
    if kind not in KINDS:
        raise UserError(f"kind={kind!r} is not one of {', '.join(KINDS)}")
    if base["world_size"] != 1 or base["config"]["parallel"] != "none":
        raise UserError(f"the baseline ran with parallel={base['config']['parallel']!r} on {base['world_size']} "
                        "process(es); take a single-GPU run without DDP (parallel=none): a 1-GPU DDP run already "
                        "pays DDP's overhead and flatters every point")
    if base["device"] != run["device"]:
        raise UserError(f"device differs: the baseline ran on {base['device']!r}, the run on {run['device']!r}; "
                        "measure both on the same card")
    for key in HELD_FIXED:
        if base["config"].get(key) != run["config"].get(key):
            raise UserError(f"{key} differs: the baseline has {key}={base['config'].get(key)!r}, the run "
                            f"{run['config'].get(key)!r}; rerun the baseline with {key}={run['config'].get(key)!r}")
    if kind == "weak" and batch_per_gpu(base) != batch_per_gpu(run):
        raise UserError(f"batch per GPU differs: the baseline has {batch_per_gpu(base)}, the run "
                        f"{batch_per_gpu(run)}; weak scaling keeps it fixed (rerun the baseline with "
                        f"batch_size={batch_per_gpu(run)})")
    if kind == "strong" and base["global_batch"] != run["global_batch"]:
        raise UserError(f"global batch differs: the baseline has {base['global_batch']}, the run "
                        f"{run['global_batch']}; strong scaling keeps it fixed (rerun the baseline with "
                        f"batch_size={run['global_batch']})")


def efficiency(run, baseline, kind: str = "weak") -> Point:
    """Speedup and efficiency of `run` (N GPUs) over `baseline` (one GPU), after check_baseline."""
    check_baseline(run, baseline, kind)
    run, base = as_dict(run), as_dict(baseline)
    speedup = run["throughput_img_s"] / base["throughput_img_s"]
    n = run["world_size"]
    return Point(n, batch_per_gpu(run), run["global_batch"], run["throughput_img_s"], speedup, speedup / n,
                 run["device"])


def best_baseline(results, run, kind: str = "weak"):
    """The fastest of `results` that is a valid baseline for `run` (UserError naming why none is)."""
    valid, why = [], None
    for r in results:
        try:
            check_baseline(run, r, kind)
            valid.append(as_dict(r))
        except UserError as e:
            why = why or str(e)
    if not valid:
        raise UserError(f"no valid single-GPU baseline among {len(results)} result(s): {why}")
    return max(valid, key=lambda r: r["throughput_img_s"])


def scaling_points(results, kind: str = "weak") -> list[Point]:
    """Every multi- or single-GPU run of `results` against its best valid baseline among them, by GPU count."""
    rows = [as_dict(r) for r in results]
    return sorted((efficiency(r, best_baseline(rows, r, kind), kind) for r in rows), key=lambda p: p.gpus)


# ---------------------------------------------------------------------------------------- large batch
def scaled_lr(base_lr: float, base_batch: int, global_batch: int, rule: str) -> float:
    """The learning rate for `global_batch`, tuned at `base_batch`: linear (Goyal et al. 2017: k times the batch,
    k times the rate; SGD), sqrt (sqrt(k) times: the rule for Adam-type optimizers) or none."""
    if rule not in LR_RULES:
        raise UserError(f"rule={rule!r} is not one of {', '.join(LR_RULES)}")
    if base_batch <= 0 or global_batch <= 0 or base_lr <= 0:
        raise UserError(f"base_lr, base_batch and global_batch must be positive (got {base_lr}, {base_batch}, "
                        f"{global_batch})")
    k = global_batch / base_batch
    return base_lr * {"none": 1.0, "linear": k, "sqrt": math.sqrt(k)}[rule]


def warmup_steps(warmup_images: int, global_batch: int) -> int:
    """Warm-up over a fixed number of images (Goyal et al.: the first epochs), whatever the batch: fewer,
    larger steps at a larger batch."""
    if warmup_images < 0 or global_batch <= 0:
        raise UserError(f"warmup_images={warmup_images} must be >= 0 and global_batch={global_batch} > 0")
    return math.ceil(warmup_images / global_batch)


def lr_recipe(cfg: TrainConfig, gpus: int, base_batch: int, rule: str, warmup_images: int = 0) -> TrainConfig:
    """cfg on `gpus` GPUs (batch per GPU kept) with its learning rate scaled by `rule` from `base_batch`,
    and a warm-up of `warmup_images` images."""
    global_batch = cfg.batch_size * gpus
    return cfg.replace(lr=scaled_lr(cfg.lr, base_batch, global_batch, rule),
                       warmup_steps=warmup_steps(warmup_images, global_batch),
                       parallel="ddp" if gpus > 1 else "none")


def time_to_target(result, target: float) -> float | None:
    """Training seconds until validation accuracy first reached `target` (its val_history), or None."""
    for step, seconds, accuracy in as_dict(result).get("val_history") or []:
        if accuracy >= target:
            return seconds
    return None


def race_rules(seeds: dict) -> list[str]:
    """The learning-rate rules a seed race ran ({"seeds": [...], "1gpu_s": [...], "<rule>_s": [...]})."""
    return [k[:-2] for k in seeds if k.endswith("_s") and k != "1gpu_s"]


def reached(v) -> bool:
    """Whether a race's entry is a time to the target (not None: never reached; not "skipped": not run)."""
    return isinstance(v, (int, float)) and v > 0


def _pairs(seeds: dict, rule: str) -> list[tuple[float, float]]:
    """(1 GPU seconds, N GPUs seconds) of the seeds where both runs reached the target."""
    return [(o, t) for o, t in zip(seeds["1gpu_s"], seeds.get(f"{rule}_s", [])) if reached(o) and reached(t)]


def speedups(seeds: dict, rule: str) -> list[float]:
    """The per-seed speedups of `rule` over 1 GPU, where both runs reached the target."""
    return [o / t for o, t in _pairs(seeds, rule)]


def race_summary(seeds: dict) -> dict:
    """A seed race (seconds to the target per seed: None where a run never reached it, "skipped" where it did not
    run) summarised per rule: the median and range of the per-seed speedups and the ratio of the mean times, over
    the seeds where both runs reached the target; `missed`: the rule's runs that never reached it."""
    out = {}
    for rule in race_rules(seeds):
        pairs, ups = _pairs(seeds, rule), speedups(seeds, rule)
        entry = out[rule] = {"seeds": len(ups), "missed": sum(t is None for t in seeds[f"{rule}_s"])}
        if ups:
            entry.update(min=min(ups), max=max(ups), median=statistics.median(ups),
                         of_means=sum(o for o, _ in pairs) / sum(t for _, t in pairs))
    return out


def pool_races(races) -> dict:
    """Several seed races as one, a rule missing from a race marked "skipped"."""
    races = list(races)
    keys = list(dict.fromkeys(k for r in races for k in r if k.endswith("_s")))
    return {"seeds": [s for r in races for s in r["seeds"]],
            **{k: [v for r in races for v in r.get(k, ["skipped"] * len(r["seeds"]))] for k in keys}}


def race_table(seeds: dict) -> str:
    """The seed-by-seed race as a Markdown table: seconds to the target per seed and rule, then the speedups."""
    rules = race_rules(seeds)
    sec = lambda v: f"{v:.2f}" if reached(v) else "missed" if v is None else str(v)  # noqa: E731
    lines = ["| seed | 1 GPU s | " + " | ".join(f"{r} s (x)" for r in rules) + " |", "|" + " ---: |" * (2 + len(rules))]
    for i, seed in enumerate(seeds["seeds"]):
        one = seeds["1gpu_s"][i]
        cells = [sec(t) + (f" ({one / t:.2f}x)" if reached(one) and reached(t) else "")
                 for t in (seeds[f"{r}_s"][i] for r in rules)]
        lines.append(f"| {seed} | {sec(one)} | " + " | ".join(cells) + " |")
    summary = race_summary(seeds)
    for what in ("median", "min", "max", "of_means"):
        label = {"of_means": "mean 1 GPU / mean N GPUs"}.get(what, f"{what} speedup")
        lines.append(f"| {label} | | " + " | ".join(
            f"{summary[r][what]:.2f}x" if what in summary[r] else "-" for r in rules) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- Slurm jobs
def write_jobs(cfg: TrainConfig, gpus=(1, 2, 4), nodes: int = 2, prefix: str = "06",
               out: str = "runs/06_scaling", **write_kw) -> list[Path]:
    """The scaling study as Slurm jobs, one per GPU count n (a job can't change its GPUs per task): an array
    whose tasks are the weak point (batch cfg.batch_size per GPU), the strong point (the same global batch
    split n ways) and, at the largest n, the weak point without gradient all-reduce (grad_sync=false); then
    the weak point on `nodes` nodes. Each task writes <out>/<n>gpu/<point>/result.json: `ledger(out)`
    collects them. write_kw go to tl.jobs.write (site, time, jobs_dir, show, ...)."""
    from .. import jobs

    counts, b, paths = _counts(gpus), cfg.batch_size, []
    for n in counts:
        sweep = None
        if n > 1:
            if b % n:
                raise UserError(f"batch_size={b} does not split over {n} GPUs for the strong point; choose a "
                                f"multiple of {math.lcm(*counts)}")
            sweep = [{"batch_size": b}, {"batch_size": b // n}]
            sweep += [{"batch_size": b, "grad_sync": False}] if n == counts[-1] else []
        paths.append(jobs.write(f"{prefix}_scaling_{n}gpu", cfg.replace(
            parallel="ddp" if n > 1 else "none", out_dir=f"{out}/{n}gpu"), gpus_per_node=n, sweep=sweep,
            description=f"notebook 06: scaling on {n} GPU(s): " + ("the single-GPU baseline" if n == 1 else
                        "weak, strong" + (" and no-sync" if n == counts[-1] else "") + " points"), **write_kw))
    if nodes > 1:
        n = counts[-1]
        paths.append(jobs.write(f"{prefix}_multinode", cfg.replace(parallel="ddp", out_dir=f"{out}/{nodes}x{n}gpu"),
                                nodes=nodes, gpus_per_node=n, description=f"notebook 06: weak scaling on {nodes} "
                                f"nodes x {n} GPUs (srun + torchrun, c10d rendezvous)", **write_kw))
    return paths


def write_lr_job(cfg: TrainConfig, gpus: int, base_batch: int, warmup_images: int, prefix: str = "06",
                 out: str = "runs/06_lr_rules", **write_kw) -> Path:
    """A job array on `gpus` GPUs, one task per learning-rate rule (lr and warm-up of `lr_recipe`), each
    recording validation accuracy against time (cfg.eval_every) until cfg.target_accuracy."""
    from .. import jobs

    sweep = []
    for rule in LR_RULES:
        c = lr_recipe(cfg, gpus, base_batch, rule, warmup_images)
        sweep.append({"lr": c.lr, "warmup_steps": c.warmup_steps, "out_dir": f"{out}/{rule}"})
    return jobs.write(f"{prefix}_lr_rules", cfg.replace(parallel="ddp" if gpus > 1 else "none", out_dir=out),
                      gpus_per_node=gpus, sweep=sweep, description=f"notebook 06: time to "
                      f"{cfg.target_accuracy} validation accuracy on {gpus} GPUs, per learning-rate rule", **write_kw)


# ---------------------------------------------------------------------------------------- ledger
def ledger(folder: str | os.PathLike) -> list[dict]:
    """Every result.json under `folder` (any depth), as dicts with their folder in "run", sorted by it."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{str(folder)!r} is not a folder; give the folder your runs wrote into (e.g. runs/06_scaling)")
    rows = []
    for path in sorted(folder.rglob("result.json")):
        r = json.loads(path.read_text())
        r["run"] = str(path.parent.relative_to(folder))
        rows.append(r)
    return rows


def ledger_row(r: dict) -> dict:
    """The flat columns of one result (LEDGER_COLUMNS)."""
    c = r["config"]
    return {"run": r.get("run", c["out_dir"]), "device": r["device"], "gpus": r["world_size"],
            "batch_per_gpu": batch_per_gpu(r), "global_batch": r["global_batch"], "precision": c["precision"],
            "grad_sync": c.get("grad_sync", True), "throughput_img_s": _round(r["throughput_img_s"], 1),
            "step_ms": _round(r["step_time_ms"]["median"], 2), "val_accuracy": r["val_accuracy"],
            "steps": r["steps"], "lr": c["lr"], "warmup_steps": c["warmup_steps"],
            "seconds": round(r["wall_time_s"], 1)}


def _round(v, digits):
    return None if v is None else round(v, digits)  # a run stopped before its first timed step has no median


def write_csv(rows: list[dict], path: str | os.PathLike) -> Path:
    """The ledger as a CSV file (one line per run), for a spreadsheet or pandas."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=LEDGER_COLUMNS)
        w.writeheader()
        w.writerows(ledger_row(r) for r in rows)
    return path


def markdown_table(rows: list[dict]) -> str:
    """The ledger as a Markdown table."""
    lines = ["| " + " | ".join(LEDGER_COLUMNS) + " |", "|" + " --- |" * len(LEDGER_COLUMNS)]
    for r in rows:
        row = ledger_row(r)
        lines.append("| " + " | ".join(_cell(row[k]) for k in LEDGER_COLUMNS) + " |")
    return "\n".join(lines)


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 10 else f"{v:,.0f}"
    return str(v)


# ---------------------------------------------------------------------------------------- plots
def plot_scaling(points: list[Point], kind: str = "weak", ax=None, label: str | None = None):
    """Throughput against GPUs with the ideal line (N x the baseline), each point labelled with its efficiency."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(5, 3.2))[1]
    gpus = [p.gpus for p in points]
    base = points[0].img_s / points[0].speedup  # the baseline's img/s
    ax.plot(gpus, [base * n for n in gpus], "--", color="gray", label="ideal: N x one GPU")
    ax.plot(gpus, [p.img_s for p in points], "o-", label=label or f"{kind} scaling")
    for p in points:
        ax.annotate(f"{100 * p.efficiency:.0f}%", (p.gpus, p.img_s), textcoords="offset points", xytext=(4, -12),
                    fontsize=8)
    ax.set_xticks(gpus)
    ax.set_xlabel("GPUs (processes)")
    ax.set_ylabel("images/s")
    ax.set_title(f"{kind} scaling on {points[0].device}", fontsize=9)
    ax.legend(fontsize=8)
    return ax


def plot_accuracy(results: dict, target: float | None = None, ax=None):
    """Validation accuracy against training seconds (val_history) for {label: result}, and the target."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(6, 3.4))[1]
    for label, r in results.items():
        history = as_dict(r).get("val_history") or []
        ax.plot([h[1] for h in history], [100 * h[2] for h in history], ".-", label=label)
    if target is not None:
        ax.axhline(100 * target, color="gray", ls="--", label=f"target {100 * target:.0f}%")
    ax.set_xlabel("training seconds (validation passes left out)")
    ax.set_ylabel("validation accuracy (%)")
    ax.legend(fontsize=8)
    return ax
