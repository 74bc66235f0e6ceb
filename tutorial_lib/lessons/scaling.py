"""Scaling studies (notebook 06): weak and strong sweeps, speedup and efficiency against the right baseline,
learning-rate rules for a larger global batch, time to a target accuracy, and a ledger of result.json files.

    points = tl.scaling.weak_sweep(cfg, gpus=(1, 2, 4))        # [(gpus, config)]: the batch per GPU fixed
    rows = tl.scaling.ledger("runs/06_scaling")                # every result.json under a folder
    tl.scaling.efficiency(rows[2], rows[0])                    # refuses a baseline that differs per GPU
    tl.scaling.decompose(run, one_gpu, baseline)               # a ratio = GPUs x weak efficiency x recipe gain
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
import math
import os
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path

from . import noise
from .. import jobs, trace_summary
from ..config import TrainConfig, UserError
from ..results import read_result
from ..values import count

KINDS = ("weak", "strong")
LR_RULES = ("none", "linear", "sqrt")
# What a run and its baseline must share: everything that changes the work of one GPU in one step.
HELD_FIXED = ("dataset", "model", "optimizer", "precision", "channels_last", "compile", "compile_mode", "cuda_graph",
              "loader", "augment", "num_workers", "pin_memory", "cudnn_benchmark", "train_size")
LEDGER_COLUMNS = ("run", "device", "gpus", "batch_per_gpu", "global_batch", "precision", "traced",
                  "throughput_img_s", "step_ms", "val_accuracy", "steps", "lr", "warmup_steps", "seconds",
                  "gpu_hours", "energy_kj", "j_per_image", "gpu_hours_to_target", "kwh_to_target")
SHOWN_COLUMNS = ("run", "gpus", "batch_per_gpu", "global_batch", "throughput_img_s", "step_ms")  # what a sweep reads
COST_COLUMNS = ("cost", "cost_unit")  # with a site profile that names a charge per GPU-hour


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
        return read_result(Path(result) / "result.json", f"give the folder of a run that finished ({result})")
    return result


def gpus_of(result, gpus: int | None = None) -> int:
    """The GPUs a run used: its processes, or for DataParallel (one process) the `gpus` it split its batch over,
    which its result does not record."""
    r = as_dict(result)
    if r["config"].get("parallel") == "dp":
        if not gpus:
            raise UserError("a DataParallel result does not record how many GPUs it split its batch over; pass "
                            "gpus=N (the GPUs visible to its process)")
        return gpus
    if gpus not in (None, r["world_size"]):
        raise UserError(f"gpus={gpus} but the run ran {count(r['world_size'], 'process', 'processes')}; "
                        "leave gpus out for DDP runs")
    return r["world_size"]


def batch_per_gpu(result, gpus: int | None = None) -> int:
    r = as_dict(result)
    return r["global_batch"] // gpus_of(r, gpus)


def check_baseline(run, baseline, kind: str = "weak", gpus: int | None = None) -> None:
    """Raise UserError naming the first thing `baseline` does not hold fixed for `run` (`gpus`: DataParallel's)."""
    run, base = as_dict(run), as_dict(baseline)
    if kind not in KINDS:
        raise UserError(f"kind={kind!r} is not one of {', '.join(KINDS)}")
    if base["world_size"] != 1 or base["config"]["parallel"] != "none":
        raise UserError(f"the baseline ran with parallel={base['config']['parallel']!r} on "
                        f"{count(base['world_size'], 'process', 'processes')}; take a single-GPU run without DDP (parallel=none): a 1-GPU DDP run already "
                        "pays DDP's overhead and flatters every point")
    if base["device"] != run["device"]:
        raise UserError(f"device differs: the baseline ran on {base['device']!r}, the run on {run['device']!r}; "
                        "measure both on the same card")
    for key in HELD_FIXED:
        if base["config"].get(key) != run["config"].get(key):
            raise UserError(f"{key} differs: the baseline has {key}={base['config'].get(key)!r}, the run "
                            f"{run['config'].get(key)!r}; rerun the baseline with {key}={run['config'].get(key)!r}")
    per_gpu = batch_per_gpu(run, gpus)
    if kind == "weak" and batch_per_gpu(base) != per_gpu:
        raise UserError(f"batch per GPU differs: the baseline has {batch_per_gpu(base)}, the run "
                        f"{per_gpu}; weak scaling keeps it fixed (rerun the baseline with batch_size={per_gpu})")
    if kind == "strong" and base["global_batch"] != run["global_batch"]:
        raise UserError(f"global batch differs: the baseline has {base['global_batch']}, the run "
                        f"{run['global_batch']}; strong scaling keeps it fixed (rerun the baseline with "
                        f"batch_size={run['global_batch']})")


def efficiency(run, baseline, kind: str = "weak", gpus: int | None = None) -> Point:
    """Speedup and efficiency of `run` (N GPUs: its processes, or `gpus` for DataParallel) over `baseline`
    (one GPU), after check_baseline."""
    check_baseline(run, baseline, kind, gpus)
    run, base = as_dict(run), as_dict(baseline)
    speedup = run["throughput_img_s"] / base["throughput_img_s"]
    n = gpus_of(run, gpus)
    return Point(n, batch_per_gpu(run, gpus), run["global_batch"], run["throughput_img_s"], speedup, speedup / n,
                 run["device"])


def best_baseline(results, run, kind: str = "weak", gpus: int | None = None):
    """The fastest of `results` that is a valid baseline for `run` (UserError naming why none is)."""
    valid, why = [], None
    for r in results:
        try:
            check_baseline(run, r, kind, gpus)
            valid.append(as_dict(r))
        except UserError as e:
            why = why or str(e)
    if not valid:
        raise UserError(f"no valid single-GPU baseline among {count(len(results), 'result')}: {why}")
    return max(valid, key=lambda r: r["throughput_img_s"])


def scaling_points(results, kind: str = "weak") -> list[Point]:
    """Every multi- or single-GPU run of `results` against its best valid baseline among them, by GPU count."""
    rows = [as_dict(r) for r in results]
    return sorted((efficiency(r, best_baseline(rows, r, kind), kind) for r in rows), key=lambda p: p.gpus)


@dataclass
class Decomposition:
    """A throughput ratio against a baseline of another recipe, taken apart:
    ratio = GPUs x weak-scaling efficiency x single-GPU recipe gain."""
    gpus: int
    weak_efficiency: float  # the run against ONE GPU of its own recipe (tl.scaling.efficiency)
    recipe_gain: float  # that one GPU against the baseline (another precision, batch, loader, ...)
    ratio: float  # the run's img/s over the baseline's: what a headline "speedup" reports

    @property
    def claimed_efficiency(self) -> float:
        """What "efficiency" the ratio claims when divided by the GPU count: weak efficiency x recipe gain."""
        return self.ratio / self.gpus


def decompose(run, one_gpu, baseline) -> Decomposition:
    """`run` (N GPUs) over `baseline` (one GPU, any recipe), as N x efficiency(run, one_gpu) x one_gpu/baseline,
    where `one_gpu` is the run's own recipe on one GPU (a valid weak-scaling baseline: checked)."""
    p = efficiency(run, one_gpu, "weak")
    base = as_dict(baseline)
    if base["world_size"] != 1:
        raise UserError(f"the baseline ran on {base['world_size']} processes; a recipe gain compares one GPU with one")
    gain = as_dict(one_gpu)["throughput_img_s"] / base["throughput_img_s"]
    return Decomposition(p.gpus, p.efficiency, gain, p.img_s / base["throughput_img_s"])


def check_claim(img_s: float, gpus: int, speedup: float, efficiency: float) -> dict:
    """A published scaling claim read back: the single-GPU throughput its speedup implies and the one its
    efficiency implies (efficiency = speedup / GPUs: the two should agree), and how far apart they are."""
    from_speedup, from_efficiency = img_s / speedup, img_s / (efficiency * gpus)
    return {"one_gpu_from_speedup": from_speedup, "one_gpu_from_efficiency": from_efficiency,
            "efficiency_from_speedup": speedup / gpus, "speedup_from_efficiency": efficiency * gpus,
            "disagreement": abs(from_speedup - from_efficiency) / min(from_speedup, from_efficiency)}


def comm_share(run_dir: str | os.PathLike) -> dict:
    """What the gradient all-reduce costs, from a run's per-rank traces (profile_ranks=all): each rank's
    communication that no compute kernel hides ("comm" of tl.trace_summary), as ms and as a share of its
    step; the job's figure is the largest share (the ranks wait for each other). Never negative."""
    ranks = {t.worker: (t.parts_ms["comm"], t.step_ms) for t in trace_summary.summarize(run_dir)}
    shares = {w: comm / step for w, (comm, step) in ranks.items() if step}
    if not shares:
        raise UserError(f"the traces under {str(run_dir)!r} hold no timed step; record more profile_active steps")
    return {"comm_ms": {w: round(c, 3) for w, (c, _) in ranks.items()},
            "step_ms": {w: round(s, 3) for w, (_, s) in ranks.items()}, "share": max(shares.values()),
            "ranks": len(ranks)}


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


def images_to_target(result, target: float) -> int | None:
    """Training images seen when validation accuracy first reached `target` (its val_history), or None: what
    a larger global batch may need more of (notebook 06, the critical batch)."""
    r = as_dict(result)
    for step, _, accuracy in r.get("val_history") or []:
        if accuracy >= target:
            return step * r["global_batch"]
    return None


def race_target(history: list, after_s: float, val_size: int, window: int = 5, margin_se: float = 4.0) -> dict:
    """A target for the time-to-accuracy race, from the one-GPU run's val_history (step, seconds, accuracy) on
    `val_size` validation images: one image above the best it had in its first `after_s` training seconds (so
    one GPU needs longer), accepted only when the run later climbed, on its curve smoothed over `window`
    validations, at least `margin_se` standard errors of a validation (sqrt(p(1-p)/val_size)) above it: then
    the target lies well below what the set allows and a run's time to it is decided by its curve, not by one
    image. Returns {"target", "rule"} or, when no accuracy meets the rule, {"target": None, "why"}: never a
    fallback."""
    early = [acc for _, seconds, acc in history if seconds <= after_s]
    if not early or len(early) == len(history):
        return {"target": None, "why": f"the one-GPU run has no validation {'before' if not early else 'after'} "
                                       f"its first {after_s:g} training seconds: train it longer"}
    one = 1 / val_size
    target = round(max(early) + one, 6)
    accs = [acc for *_, acc in history]
    k = min(window, len(accs))
    best = max(sum(accs[i:i + k]) / k for i in range(len(accs) - k + 1))
    margin = margin_se * math.sqrt(max(target * (1 - target), 0.0) / val_size)
    words = (f"one image above the best validation of the one-GPU run's first {after_s:g} training seconds "
             f"({max(early):.2%} of {val_size:,} images), at least {margin_se:g} standard errors below the best it "
             f"reached later (smoothed over {k} validations: {best:.2%})")
    if target > 1 or best < target + max(margin, one):
        wrong = round(val_size * (1 - max(early)))
        return {"target": None, "best_early": max(early), "best_smoothed": best,
                "why": f"the one-GPU run reached {max(early):.2%} ({wrong:,} wrong of {val_size:,}) within its "
                       f"first {after_s:g} training seconds and at best {best:.2%} later (smoothed over {k} "
                       f"validations), and a target must lie one image above the first and "
                       f"{count(round(max(margin, one) * val_size), 'image')} below the second: the set is learned too soon "
                       f"for a race of this length (a harder set, or a longer race)"}
    return {"target": target, "rule": words, "best_early": max(early), "best_smoothed": best}


# ---------------------------------------------------------------------------------------- the rule
def figure(result, times: float = 1.0, bench: dict | None = None) -> noise.Figure:
    """A run's img/s (x `times`: N x one GPU is the ideal) as an estimate of its mean (lessons/noise.py): from the
    FULL windows of the bench that measured this run (its FULL is the run's figure), where the record keeps it,
    else from its blocks of steps (or its p10/p90 steps, noise.of_steps)."""
    r = as_dict(result)
    full = (bench or {}).get("full")
    if full and full.get("img_s_low") and math.isclose(full["img_s"], r["throughput_img_s"] * 1.0, rel_tol=1e-9):
        f = noise.of_range(full["img_s"], full["img_s_low"], full["img_s_high"], full.get("windows", 10))
        if full.get("window_img_s"):
            f = noise.of_windows(full["window_img_s"], full["img_s"])
    else:
        s = r["step_time_ms"]
        f = noise.of_steps(r["throughput_img_s"], s.get("median"), s.get("p10"), s.get("p90"),
                           s.get("timed_steps") or r.get("steps", 0), s.get("block_ms"), r.get("global_batch"))
    return noise.Figure(f.value * times, f.se, f.n, f.spread, f.unit)


def scaling_verdict(run, baseline, gpus: int, run_bench: dict | None = None, base_bench: dict | None = None) -> dict:
    """A multi-GPU run against N x its one-GPU baseline (the ideal) and against one GPU, each by the rule
    (noise.compare, two runs): the efficiency with its interval and a verdict in words. An efficiency above 1
    is never superlinear scaling: it says to measure both again."""
    fig, one = figure(run, bench=run_bench), figure(baseline, bench=base_bench)
    ideal = noise.Figure(one.value * gpus, one.se, one.n, None, one.unit)
    r_ideal, r_one = noise.compare(fig, ideal), noise.compare(fig, one)
    if r_one.verdict == "lower":
        words = "slower than one GPU"
    elif r_ideal.verdict == "equal":
        words = f"within noise of {gpus} x one GPU (the ideal)"
    elif r_ideal.verdict == "higher":
        words = f"above {gpus} x one GPU: a baseline slower than usual? measure both again"
    elif r_ideal.verdict == "lower":
        words = f"below {gpus} x one GPU" + (", faster than one GPU" if r_one.verdict == "higher" else "")
    else:
        words = f"against {gpus} x one GPU {r_ideal.words()}"
    return {"efficiency_band": (r_ideal.low, r_ideal.high), "vs_ideal": r_ideal.sign, "vs_one": r_one.sign,
            "verdict": words}


# ---------------------------------------------------------------------------------------- Slurm jobs
def traced(cfg: TrainConfig, wait: int = 20) -> dict:
    """The keys that trace a run on every rank, for comm_share: 2 steps recorded after 1 thrown away, starting
    `wait` steps in (fewer when the run is shorter). The trace slows the run: its img/s is not a figure to quote."""
    return dict(profile=True, profile_ranks="all", profile_wait=max(0, min(wait, (cfg.steps or 100) - 3)),
                profile_warmup=1, profile_active=2, profile_memory=False, profile_record_shapes=False)


def write_jobs(cfg: TrainConfig, gpus=(1, 2, 4), nodes: int = 2, prefix: str = "06",
               out: str = "runs/06_scaling", **write_kw) -> list[Path]:
    """The scaling study as Slurm jobs, one per GPU count n (a job can't change its GPUs per task): an array
    whose tasks are the weak point (batch cfg.batch_size per GPU), the strong point (the same global batch
    split n ways) and, at the largest n, the weak point traced on every rank (`traced`: what the all-reduce
    costs, `comm_share`); then the weak point on `nodes` nodes. Each task writes <out>/<n>gpu/<point>/
    result.json: `ledger(out)` collects them. write_kw go to tl.jobs.write (site, time, jobs_dir, show, ...)."""
    counts, b, paths = _counts(gpus), cfg.batch_size, []
    for n in counts:
        sweep = None
        if n > 1:
            if b % n:
                raise UserError(f"batch_size={b} does not split over {n} GPUs for the strong point; choose a "
                                f"multiple of {math.lcm(*counts)}")
            sweep = [{"batch_size": b}, {"batch_size": b // n}]
            sweep += [{"batch_size": b, **traced(cfg), "out_dir": f"{out}/{n}gpu/traced"}] if n == counts[-1] else []
        paths.append(jobs.write(f"{prefix}_scaling_{n}gpu", cfg.replace(
            parallel="ddp" if n > 1 else "none", out_dir=f"{out}/{n}gpu"), gpus_per_node=n, sweep=sweep,
            description=f"notebook 06: scaling on {count(n, 'GPU')}: " + ("the single-GPU baseline" if n == 1 else
                        "weak, strong" + (" and traced" if n == counts[-1] else "") + " points"), **write_kw))
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
        try:  # one damaged job (a truncated file) must not stop the collection of the others
            r = read_result(path, "run that job again to collect it")
        except UserError as e:
            print(f"skipped {e}")
            continue
        r["run"] = str(path.parent.relative_to(folder))
        rows.append(r)
    return rows


def ledger_row(r: dict, site=None) -> dict:
    """The flat columns of one result (LEDGER_COLUMNS; and COST_COLUMNS when `site`, a sites.Site, names a charge
    per GPU-hour). What the run cost: GPU-hours (GPUs x wall time), the timed window's energy and joules per
    image (null where the run had no energy counter: its energy_note says why), and to its target accuracy."""
    c, energy = r["config"], r.get("energy_j")
    row = {"run": r.get("run", c["out_dir"]), "device": r["device"], "gpus": r["world_size"],  # DataParallel: 1
           "batch_per_gpu": r["global_batch"] // r["world_size"], "global_batch": r["global_batch"],
           "precision": c["precision"], "traced": c.get("profile", False),
           "throughput_img_s": _round(r["throughput_img_s"], 1),
           "step_ms": _round(r["step_time_ms"]["median"], 2), "val_accuracy": r["val_accuracy"],
           "steps": r["steps"], "lr": c["lr"], "warmup_steps": c["warmup_steps"],
           "seconds": round(r["wall_time_s"], 1), "gpu_hours": _round(r.get("gpu_hours"), 5),
           "energy_kj": None if energy is None else round(energy / 1000, 3),
           "j_per_image": _round(r.get("joules_per_image"), 4),
           "gpu_hours_to_target": _round(r.get("gpu_hours_to_target"), 5),
           "kwh_to_target": _round(r.get("kwh_to_target"), 6)}
    if charged(site):
        hours = r.get("gpu_hours")
        row.update(cost=None if hours is None else round(hours * site.charge_per_gpu_hour, 4),
                   cost_unit=site.charge_unit)
    return row


def charged(site) -> bool:
    return site is not None and getattr(site, "charge_per_gpu_hour", None) is not None


def _round(v, digits):
    return None if v is None else round(v, digits)  # a run stopped before its first timed step has no median


def write_csv(rows: list[dict], path: str | os.PathLike, site=None) -> Path:
    """The ledger as a CSV file (one line per run), for a spreadsheet or pandas; `site`: see ledger_row."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=LEDGER_COLUMNS + (COST_COLUMNS if charged(site) else ()))
        w.writeheader()
        w.writerows(ledger_row(r, site) for r in rows)
    return path


def markdown_table(rows: list[dict], root: str | os.PathLike | None = None, site=None, columns=None) -> str:
    """The ledger as a Markdown table (`root`: the folder it was read from, shown in front of each run's folder;
    `site`: a charge per GPU-hour gives a cost column; `columns`: e.g. SHOWN_COLUMNS, write_csv keeps all)."""
    if any(k not in LEDGER_COLUMNS for k in columns or ()):
        raise UserError(f"columns={columns!r} are not ledger columns; choose from {', '.join(LEDGER_COLUMNS)}")
    columns = tuple(columns or LEDGER_COLUMNS) + (("cost",) if charged(site) else ())
    lines = ["| " + " | ".join(f"cost ({site.charge_unit})" if k == "cost" else k for k in columns) + " |",
             "|" + " --- |" * len(columns)]
    for r in rows:
        row = ledger_row(r, site)
        if root is not None:
            row["run"] = f"{Path(root).as_posix()}/{row['run']}"
        lines.append("| " + " | ".join(_cell(row[k]) for k in columns) + " |")
    return "\n".join(lines)


def _cell(v) -> str:
    if v is None:  # not measured in that run (no validation, no energy counter, ...)
        return "-"
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 10 else f"{v:,.0f}"
    return str(v)


# ---------------------------------------------------------------------------------------- plots
def plot_scaling(points: list[Point], kind: str = "weak", ax=None, label: str | None = None):
    """Throughput against GPUs with the ideal line (N x the baseline), each point labelled with its efficiency."""
    import matplotlib.pyplot as plt  # most of a second to import: only plots need it

    ax = ax or plt.subplots(figsize=(5, 3.2))[1]
    gpus = [p.gpus for p in points]
    base = points[0].img_s / points[0].speedup  # the baseline's img/s
    ax.plot(gpus, [base * n for n in gpus], "--", color="gray", label="ideal: N x one GPU")
    ax.plot(gpus, [p.img_s for p in points], "o-", label=label or f"{kind} scaling")
    for p in points:
        ax.annotate(f"{100 * p.efficiency:.0f}%", (p.gpus, p.img_s), textcoords="offset points", xytext=(4, -12),
                    fontsize=8)
    ax.set(xticks=gpus, xlabel="GPUs (processes)", ylabel="images/s")
    ax.set_title(f"{kind} scaling on {points[0].device}", fontsize=9)
    ax.legend(fontsize=8)
    return ax


def plot_accuracy(results: dict, target: float | None = None, ax=None):
    """Validation accuracy against training seconds (val_history) for {label: result}, and the target."""
    import matplotlib.pyplot as plt  # most of a second to import: only plots need it

    ax = ax or plt.subplots(figsize=(6, 3.4))[1]
    for label, r in results.items():
        history = as_dict(r).get("val_history") or []
        ax.plot([h[1] for h in history], [100 * h[2] for h in history], ".-", label=label)
    if target is not None:
        ax.axhline(100 * target, color="gray", ls="--", label=f"target {100 * target:.0f}%")
    ax.set(xlabel="training seconds (validation passes left out)", ylabel="validation accuracy (%)")
    ax.legend(fontsize=8)
    return ax
