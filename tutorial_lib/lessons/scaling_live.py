"""Notebook 06's live cells and its readings of the reference record: the live sweep's recipe (GPUs, or CPU
processes where a server has fewer than two), one point run with its output to a log, strong scaling's fall
taken apart, notebook 01's baseline beside the reference's, and the race's headline (the wait first).

    cfg = tl.scaling_live.live_recipe(S, cpu=True)              # gloo processes at tiny sizes
    tl.scaling_live.strong_split_lines(F)                       # 0.666 = 0.753 (smaller batch) x 0.884 (DDP)
    tl.scaling_live.race_headline(F)                            # 'to 71.74%: you wait ... ; training alone ...'
"""
from __future__ import annotations

from pathlib import Path

from . import noise, scaling
from .scaling_study import SMALL, _result, race_holds, race_rows, recipe
from ..config import ROOT, load
from ..values import count


def live_recipe(size, cpu: bool):
    """Notebook 06's live sweep: the recipe at the notebook's sizes, or with `cpu` (no GPU, or a server with fewer
    than two) the tiny CPU version on gloo processes, whatever the size: CPU processes stand in for GPUs."""
    size = SMALL if cpu else size
    return recipe(size).replace(train_size=size.pick(256, 16384), steps=size.pick(8, 200),
                                log_every=size.pick(8, 200), progress=False, resume=False)


def differs(cfg, recipe_cfg=None) -> str:
    """'configs/optimized.yaml', or that name with the keys of `cfg` that change a GPU's work in a step and
    differ from it (tl.scaling.HELD_FIXED and the batch): what to print beside a comparison of two recipes."""
    recipe_cfg = recipe_cfg or load(ROOT / "configs" / "optimized.yaml")
    keys = [k for k in (*scaling.HELD_FIXED, "batch_size") if k != "train_size"
            and getattr(cfg, k) != getattr(recipe_cfg, k)]
    words = ", ".join(f"{k}={getattr(cfg, k)}" for k in keys)
    return "configs/optimized.yaml" + (f" with {words}" if words else "")


def race_headline(fig: dict) -> list[str]:
    """Time to the target, one configuration per side: what a person waits first (training and the fixed costs),
    then the training alone. First the run on every GPU at one GPU's batch per GPU (like with like: the fastest
    rule), then the fastest at another batch per GPU, named on both sides; where it beats N times, why."""
    rows = race_rows(fig)
    if not (rows and race_holds(fig) and rows[0].get("wait_s")):
        return ["time to the target: no headline figure from this record (its race has no target the runs climb "
                "through)"]
    one, target = rows[0], fig["race"]["target"]
    ran = [r for r in rows[1:] if r["seconds_to_target"]]
    like = [r for r in ran if r["global_batch"] // r["gpus"] == one["global_batch"]]
    other = [r for r in ran if r not in like]
    out = []
    for group in (like, other):
        if group:
            out.append(_headline_line(one, min(group, key=lambda r: r["wait_s"]), target))
    fastest = min(other, key=lambda r: r["seconds_to_target"], default=None)
    if fastest and fastest["sooner"] > fastest["gpus"]:
        n = fastest["gpus"]
        per_gpu = fastest["img_s"] / n / one["img_s"]
        images = fastest["images_to_target"] / one["images_to_target"]
        out.append(f"{_side(fastest)} train more than {n}x sooner: each of its GPUs ran {per_gpu:.2f}x one GPU's images per second "
                   f"(batch {fastest['global_batch'] // n} per GPU against {one['global_batch']}), needing {images:.2f}x "
                   "the images: the batch per GPU, not the GPUs")
    return out


def _side(r: dict) -> str:
    return f"{count(r['gpus'], 'GPU')} at {r['global_batch'] // r['gpus']} per GPU"


def _headline_line(one: dict, r: dict, target: float) -> str:
    """'to 71.74%: you wait 103 s (1 GPU at 256 per GPU) -> 88 s (4 GPUs at 256 per GPU, lr rule sqrt): 1.17x
    sooner; training alone 61.9 s -> 14.0 s: 4.43x sooner', each direction by the rule (two single runs)."""
    def verdict(a: float, b: float) -> str:  # seconds: fewer is sooner
        words = noise.compare(noise.Figure.of(1 / a), noise.Figure.of(1 / b)).words("sooner", "later")
        return f"{b / a:.2f}x" + (" " if words in ("sooner", "later") else ", ") + words
    rule = r["about"].split("lr rule ")[-1]
    return (f"to {target:.2%}: you wait {one['wait_s']:.0f} s ({_side(one)}) -> {r['wait_s']:.0f} s ({_side(r)}, "
            f"lr rule {rule}): {verdict(r['wait_s'], one['wait_s'])}; training alone {one['seconds_to_target']:.1f} s "
            f"-> {r['seconds_to_target']:.1f} s: {verdict(r['seconds_to_target'], one['seconds_to_target'])}")


def run_point(name: str, cfg, n: int, out: str, bench: tuple | None = None, unit: str = "GPU"):
    """One point of the live sweep, its output into <out>/<name>/log.txt: in this kernel without DDP (n=1) or on
    n processes through torchrun; `bench`: notebook 03's bench (--steps, S, --window, W) instead of training.
    Prints one line (img/s, step, data wait) and returns the result."""
    import contextlib

    import tutorial_lib as tl

    cfg = cfg.replace(out_dir=f"{out}/{name}", parallel="ddp" if n > 1 else "none")
    Path(cfg.out_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(cfg.out_dir) / "log.txt", "w") as log, contextlib.redirect_stdout(log):
        if n > 1:
            tl.launch(cfg, nproc=n, command="bench" if bench else "train", args=bench or ())
        elif bench:
            tl.bench.bench(cfg, int(bench[1]), int(bench[3]))
        else:
            tl.train(cfg)
    result = tl.load_result(cfg.out_dir)
    r = scaling.as_dict(result)
    print(f"{name}: {count(n, unit, 'processes' if unit == 'process' else None)}, {r['global_batch'] // n} per "
          f"{unit}: {r['throughput_img_s']:,.0f} img/s{result._waited()} (log: {cfg.out_dir}/log.txt)")
    return result


def strong_split(fig: dict) -> dict | None:
    """The strong point's efficiency (N GPUs at B/N each against one GPU at B) taken apart into its two causes:
    one GPU at the smaller batch B/N against one GPU at B (the race's one-GPU run: the same model, image size,
    recipe and data on the GPU, another set of shapes), and N GPUs at B/N against N x that one GPU (what DDP
    costs at that batch). The product is the efficiency exactly. None where a run is missing."""
    n = fig["gpus"]
    strong, one, small = _result(fig, f"strong_{n}"), _result(fig, "weak_1"), _result(fig, "race_1")
    if not (strong and one and small) or small["global_batch"] != strong["global_batch"] // n:
        return None
    p = scaling.efficiency(strong, one, "strong")
    batch = small["throughput_img_s"] / one["throughput_img_s"]
    ddp = strong["throughput_img_s"] / (n * small["throughput_img_s"])
    return {"gpus": n, "efficiency": p.efficiency, "batch": batch, "ddp": ddp, "strong": strong, "one": one,
            "small": small, "per_gpu": small["global_batch"], "global": one["global_batch"],
            "batch_verdict": noise.versus(scaling.figure(small), scaling.figure(one), up="faster", down="slower"),
            "ddp_verdict": noise.versus(scaling.figure(strong), scaling.figure(small, n), up="faster", down="slower")}


def strong_split_lines(fig: dict) -> list[str]:
    s = strong_split(fig)
    if not s:
        return ["no split of the strong point from this record (a run is missing)"]
    n, b, g = s["gpus"], s["per_gpu"], s["global"]
    return [f"strong, {n} GPUs at {b} per GPU (global batch {g}): efficiency {s['efficiency']:.3f} = "
            f"{s['batch']:.3f} (the smaller batch) x {s['ddp']:.3f} (DDP)",
            f"  the smaller batch: 1 GPU at {b} (the race's one-GPU run) runs {s['small']['throughput_img_s']:,.0f} img/s, at {g} "
            f"{s['one']['throughput_img_s']:,.0f}: {s['batch_verdict']}",
            f"  DDP: {n} GPUs at {b} each run {s['strong']['throughput_img_s']:,.0f} img/s against {n} x "
            f"{s['small']['throughput_img_s']:,.0f}: {s['ddp_verdict']}"]


def baseline_beside(live: dict, fig: dict | None) -> str | None:
    """Notebook 01's baseline run here beside the same configuration in the reference run, on the same card only:
    their img/s, their wait for data, and by the rule whether they still differ once the wait is taken out."""
    ref = _result(fig, "baseline") if fig else None
    live = scaling.as_dict(live)
    if not ref or ref["device"] != live["device"]:
        return None

    def parts(r):
        step = 1000 * r["global_batch"] / r["throughput_img_s"]
        wait = min(r.get("data_wait_ms") or 0.0, step) / step
        return r["throughput_img_s"], wait, r["throughput_img_s"] / (1 - wait) if wait < 1 else float("nan")

    (a, wa, ca), (b, wb, cb) = parts(live), parts(ref)
    same = noise.compare(noise.Figure.of(ca), noise.Figure.of(cb)).words("higher", "lower")
    return (f"the same configuration in the reference run: {b:,.0f} img/s, waiting for data {wb:.0%} of the time; "
            f"here {a:,.0f}, waiting {wa:.0%}. Without the wait: {ca:,.0f} here against {cb:,.0f}, {same}")
