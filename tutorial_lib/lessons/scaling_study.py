"""Notebook 06's GPU study: scaling the recipe of configs/optimized.yaml over the GPUs of one node, measured.

    python -m tutorial_lib study scaling --reference     # a 4-GPU node: about 7 minutes
    python -m tutorial_lib study scaling --small         # the same code with tiny sizes on a CPU (2 gloo ranks)

Every run is the workbook's command line, one at a time with the node to itself (lessons/cases.py), in the
recipe of configs/optimized.yaml (bf16, channels_last, the dataset on the GPU, the whole step compiled and
recorded as one CUDA graph, gradient all-reduce inside). Stages, the figures written after each:
  1. weak scaling at batch 1024 per GPU: notebook 03's bench (IO / SYNTHETIC / FULL) on 1, 2 and 4 GPUs;
  2. notebook 01's baseline (configs/baseline.yaml) on one GPU: the recipe's gain, for the headline;
  3. the race to a target accuracy on shapes_hard at batch 256 per GPU: one GPU trains about RACE_S seconds'
     worth of images on a cosine schedule; the target is set from that run (race_target: above anything it
     reached in its first AFTER_S seconds); then 4 GPUs with the sqrt and the linear rule, over the same
     images and validated after the same images, stop at the target;
  4. strong scaling at a global batch of 1024 (256 per GPU);
  5. what the all-reduce costs: the 4-GPU weak point traced on every rank (tl.scaling.comm_share);
  6. the race's last points: no scaling of the rate, and 1024 per GPU (a global batch of 4096).
Speedup and efficiency come from tl.scaling.efficiency only, against the same recipe on one GPU.
"""
from __future__ import annotations

import json
from pathlib import Path

from . import scaling
from .cases import Case, Runner
from ..config import ROOT, UserError, load

BUDGET_S = 440
RACE_S, AFTER_S = 85.0, 60.0  # one GPU trains about RACE_S seconds; the target is out of its reach before AFTER_S
B256_OVER_B1024 = 0.75  # one GPU's img/s at batch 256 over 1024 in this recipe (notebook 04's ladder): sizes the race
BASE_LR, WARMUP_IMAGES = 2e-3, 100_000


def recipe(size):
    """configs/optimized.yaml, with throughput sizes (a CPU: the tiny version, neither compiled nor graphed)."""
    cfg = load(ROOT / "configs" / "optimized.yaml").replace(
        train_size=size.pick(256, 16384), steps=size.pick(6, 150), timing_warmup=size.pick(2, 30), num_workers=0,
        eval=False, tensorboard=False, log_every=size.pick(3, 50), lr_schedule="constant")
    if size.small:
        cfg = cfg.replace(model="resnet18_imagenet", precision="fp32", channels_last=False, compile=False,
                          cuda_graph=False, device="cpu", batch_size=16)
    return cfg


def race_recipe(size):
    return recipe(size).replace(dataset="shapes_hard", train_size=size.pick(512, None), val_size=size.pick(64, 5000),
                                batch_size=size.pick(8, 256), lr=BASE_LR, lr_schedule="cosine",
                                timing_warmup=size.pick(2, 10))


def study(size, out: Path) -> dict[str, dict]:
    """`python -m tutorial_lib study scaling`: the stages in order, the record rewritten after each."""
    import torch

    gpus = size.pick(2, min(4, torch.cuda.device_count()))
    runner = Runner(out, size.pick(1800, BUDGET_S), 0 if size.small else torch.cuda.device_count())
    fig = {"recipe": " ".join(recipe(size).to_overrides()), "gpus": gpus, "counts": [n for n in (1, 2, 4) if n <= gpus],
           "batch_per_gpu": recipe(size).batch_size, "runs": runner.records}
    for stage in (weak_stage, baseline_stage, race_stage, strong_stage, comm_stage, more_race_stage):
        stage(size, runner, fig)
        runner.save()
        (Path(out) / "06_scaling.partial.json").write_text(json.dumps(fig, indent=1) + "\n")
    return {"06_scaling": fig}


def _case(name, cfg, gpus, about, estimate_s, **kw) -> Case:
    return Case(name, cfg.replace(parallel="ddp" if gpus > 1 else "none"), gpus, about, estimate_s=estimate_s, **kw)


def weak_stage(size, runner: Runner, fig: dict) -> None:
    bench = ("--steps", str(size.pick(4, 60)), "--window", str(size.pick(2, 10)))
    for n in fig["counts"]:
        runner.run(_case(f"weak_{n}", recipe(size), n, f"weak scaling, {n} GPU(s)", size.pick(60, 45 if n == 1 else 30),
                         command="bench", args=bench))


def baseline_stage(size, runner: Runner, fig: dict) -> None:
    cfg = load(ROOT / "configs" / "baseline.yaml").replace(
        steps=size.pick(6, 200), timing_warmup=size.pick(2, 30), eval=False, tensorboard=False,
        log_every=size.pick(3, 100), train_size=size.pick(256, None), num_workers=size.pick(0, "auto"),
        **({"model": "resnet18_imagenet", "device": "cpu", "batch_size": 8} if size.small else {}))
    runner.run(_case("baseline", cfg, 1, "notebook 01's baseline, 1 GPU", size.pick(60, 30)))


def race_stage(size, runner: Runner, fig: dict) -> None:
    """One GPU first (the target comes from it), then two rules on every GPU."""
    base = race_recipe(size)
    one_img_s = (runner.result("weak_1") or {}).get("throughput_img_s")
    if size.small:
        steps = 24
    elif one_img_s:
        steps = round(RACE_S * B256_OVER_B1024 * one_img_s / base.batch_size)
    else:
        fig["race"] = {"skipped": "no one-GPU throughput to size the race with (the weak stage did not run)"}
        return
    images, every = steps * base.batch_size, max(1, steps // size.pick(6, 50))
    race = fig["race"] = {"images": images, "eval_every_images": every * base.batch_size, "base_lr": BASE_LR,
                          "warmup_images": size.pick(32, WARMUP_IMAGES), "after_s": size.pick(0.5, AFTER_S),
                          "batch_per_gpu": base.batch_size, "dataset": base.dataset}
    one = scaling.lr_recipe(base, 1, base.batch_size, "none", race["warmup_images"]).replace(
        steps=steps, eval_every=every)
    rec = runner.run(_case("race_1", one, 1, "1 GPU", size.pick(60, RACE_S + 45)))
    if not rec.get("result"):
        return
    history, after = rec["result"]["val_history"], race["after_s"]
    if not history:
        race["skipped"] = "the one-GPU run recorded no validation"
        return
    target = scaling.race_target(history, after, 1 / one.val_size)  # one image more
    race["target_rule"] = f"one image above the best validation of the one-GPU run's first {after:g} training seconds"
    if target is None:  # the run never beat its first minute: the best it reached is the target
        target = max(acc for *_, acc in history)
        race["target_rule"] = (f"the best validation of the one-GPU run (it never beat its first {after:g} training "
                               "seconds later)")
    race["target"] = target
    race_points(size, runner, fig, [("sqrt", base.batch_size), ("linear", base.batch_size)])


def race_points(size, runner: Runner, fig: dict, points: list) -> None:
    """The race on every GPU, each (rule, batch per GPU) over the one-GPU run's images, validated after the same
    images, stopped at the target."""
    race, base, n = fig.get("race", {}), race_recipe(size), fig["gpus"]
    if "target" not in race:
        return
    steps, every = race["images"] // base.batch_size, race["eval_every_images"] // base.batch_size
    for rule, per_gpu in points[:1] if size.small else points:  # small: the code path once
        cfg = scaling.lr_recipe(base.replace(batch_size=per_gpu), n, base.batch_size, rule, race["warmup_images"])
        k = n * per_gpu // base.batch_size  # times the one-GPU run's images per step
        cfg = cfg.replace(steps=max(1, steps // k), eval_every=max(1, every // k), target_accuracy=race["target"])
        about = f"{n} GPUs, {per_gpu} per GPU, lr rule {rule}"
        runner.run(_case(f"race_{n}_{per_gpu}_{rule}", cfg, n, about, size.pick(60, RACE_S * 1.2 / k + 35)))


def more_race_stage(size, runner: Runner, fig: dict) -> None:
    """The last rule, and a 4x larger batch per GPU (the critical batch): after the stages that matter more."""
    if size.small:  # the race's code path ran once already
        return
    race_points(size, runner, fig, [("none", race_recipe(size).batch_size), ("sqrt", 1024)])


def strong_stage(size, runner: Runner, fig: dict) -> None:
    if size.small:  # the same runs as the weak stage's with another batch: nothing new to test on a CPU
        return
    cfg = recipe(size)
    for n, c in scaling.strong_sweep(cfg, cfg.batch_size, fig["counts"][-1:]):  # 1 GPU: the weak stage's
        runner.run(_case(f"strong_{n}", c, n, f"strong scaling, {n} GPUs, {c.batch_size} per GPU", size.pick(60, 40)))


def comm_stage(size, runner: Runner, fig: dict) -> None:
    n = fig["gpus"]
    cfg = recipe(size)
    cfg = cfg.replace(**scaling.traced(cfg, wait=40))
    rec = runner.run(_case(f"traced_{n}", cfg, n, f"weak scaling, {n} GPUs, every rank traced", size.pick(60, 35)))
    if rec.get("result"):
        fig["comm"] = scaling.comm_share(Path(runner.runs) / rec["case"])


# ---------------------------------------------------------------------------------------- reading the record
def _result(fig: dict, name: str) -> dict | None:
    return fig["runs"].get(name, {}).get("result")


def points(fig: dict, kind: str) -> list:
    """The weak (or strong) points that ran, each against the one-GPU weak run (tl.scaling.efficiency)."""
    one = _result(fig, "weak_1")
    names = [f"weak_{n}" for n in fig["counts"]] if kind == "weak" else ["weak_1", f"strong_{fig['gpus']}"]
    runs = [r for r in (_result(fig, k) for k in names) if r]
    return [scaling.efficiency(r, one, kind) for r in runs] if one else []


def headline(fig: dict) -> dict | None:
    """Notebook 01's baseline against the weak run on every GPU, taken apart (tl.scaling.decompose)."""
    run, one, base = (_result(fig, f"weak_{fig['gpus']}"), _result(fig, "weak_1"), _result(fig, "baseline"))
    if not (run and one and base):
        return None
    d = scaling.decompose(run, one, base)
    return {"decomposition": d, "run": run, "one": one, "baseline": base}


def race_costs(rec: dict, target: float) -> dict:
    """A race run's training seconds to the target and the fixed costs before it (start-up, the first step
    with its compilation, the validation passes so far), in seconds and as a share of the wait."""
    r = rec["result"]
    history = r["val_history"]
    k = next((i for i, (_, _, acc) in enumerate(history) if acc >= target), None)
    if k is None:
        return {"seconds_to_target": None, "images_to_target": None}
    trained = history[-1][1]
    first = r.get("compile_time_s") or 0.0
    per_eval = max(0.0, r["wall_time_s"] - first - trained) / len(history)
    fixed = max(0.0, rec["wall_s"] - r["wall_time_s"]) + first + per_eval * (k + 1)
    t = history[k][1]
    return {"seconds_to_target": t, "images_to_target": scaling.images_to_target(r, target), "fixed_s": fixed,
            "wait_s": fixed + t, "fixed_share": fixed / (fixed + t)}


def race_rows(fig: dict) -> list[dict]:
    """Every race run that ran: its configuration, img/s, time and images to the target, fixed costs, and
    how many times sooner than one GPU (training seconds, and the whole wait)."""
    race = fig.get("race", {})
    if "target" not in race:
        return []
    out = []
    for name, rec in fig["runs"].items():
        if name.startswith("race_") and rec.get("result"):
            r = rec["result"]
            out.append({"case": name, "about": rec["about"], "gpus": r["world_size"], "global_batch": r["global_batch"],
                        "lr": r["config"]["lr"], "img_s": r["throughput_img_s"], **race_costs(rec, race["target"])})
    one = out[0] if out and out[0]["gpus"] == 1 else None
    for row in out:
        for key, ratio in (("seconds_to_target", "sooner"), ("wait_s", "sooner_waiting")):
            ok = one and one.get(key) and row.get(key)
            row[ratio] = one[key] / row[key] if ok else None
    return out


def weak_b256(fig: dict) -> list[tuple[str, object]]:
    """Weak scaling at the race's batch per GPU, from the race runs (the same recipe: only the learning rate and
    its schedule differ, which leave the work of a step as it is): (what the run was, its Point)."""
    one, out = _result(fig, "race_1"), []
    for rec in fig["runs"].values():
        r = rec.get("result")
        if one and rec["case"].startswith("race_") and r and r["world_size"] > 1 and r["throughput_img_s"]:
            try:
                out.append((rec["about"], scaling.efficiency(r, one)))
            except UserError:  # another batch per GPU: not a weak point of the race's one-GPU run
                continue
    return out


def differs(cfg, recipe_cfg=None) -> str:
    """'configs/optimized.yaml', or that name with the keys of `cfg` that change a GPU's work in a step and
    differ from it (tl.scaling.HELD_FIXED and the batch): what to print beside a comparison of two recipes."""
    recipe_cfg = recipe_cfg or load(ROOT / "configs" / "optimized.yaml")
    keys = [k for k in (*scaling.HELD_FIXED, "batch_size") if k != "train_size"
            and getattr(cfg, k) != getattr(recipe_cfg, k)]
    words = ", ".join(f"{k}={getattr(cfg, k)}" for k in keys)
    return "configs/optimized.yaml" + (f" with {words}" if words else "")


def images_by_global_batch(fig: dict) -> list[dict]:
    """The race runs' images to the target by global batch and rule (a larger global batch may need more)."""
    return [{"global_batch": r["global_batch"], "about": r["about"], "images_to_target": r["images_to_target"]}
            for r in race_rows(fig)]
