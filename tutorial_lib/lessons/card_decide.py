"""The card's rungs decided by the rule, and the recommendation without what measured slower (lessons/card.py).

A rung is timed for the card's steps; where the rule (lessons.noise.compare) cannot yet tell it from the row it
changes ("not settled": its interval is too wide), it is run once more for as many steps as the rule says would
decide, if the card's time budget still holds them. The rungs stack, so the fastest rung carries every change
below it; a change that measured slower than the row it changed is taken out of the recommendation (where the
configuration allows it), and the recommendation is then trained and timed as recommended.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable

from . import ladder, noise
from ..config import TrainConfig, UserError

MAX_STEPS = 2000  # a rung run longer to decide never takes more timed steps than this
RECOMMENDED = ladder.Rung("recommended", "the recommendation as recommended, without the changes that measured slower")


def settle(rows: list[dict], row: dict, rerun: Callable[[int], dict], deadline: float) -> dict:
    """`row` (the last rung measured; rows: those before it), or its rerun for more steps where the rule can't yet
    tell it from the row it changes and the steps fit before `deadline` (time.perf_counter())."""
    base = ladder.compared_with([*rows, row]).get(row["rung"])
    got = {r["rung"]: r for r in rows if not r["skipped"]}
    if row.get("skipped") or base not in got:
        return row
    said = noise.compare(ladder.figure(row), ladder.figure(got[base]))
    if said.verdict != "not settled" or not said.more:
        return row
    steps = min(MAX_STEPS, row["steps"] + said.more * (noise.BLOCK if said.unit == "steps" else 1))
    if time.perf_counter() + 2 * steps * row["step_ms"] / 1000 + (row.get("compile_s") or 0) > deadline:
        return row
    again = rerun(steps)
    return row if again.get("skipped") else {**again, "settled_from_steps": row["steps"]}


def settle_all(rows: list[dict], plan: list[tuple], rerun: Callable, deadline: float) -> list[dict]:
    """Every measured rung, in order, settled against the row it changes (settle) while time is left before
    `deadline`: after all rungs ran, so that running one longer never leaves a later rung unmeasured.
    rerun(rung, planned config, timed steps) -> row."""
    planned = {rung.name: (rung, cfg) for rung, cfg, _ in plan}
    out = []
    for row in rows:
        rung, cfg = planned[row["rung"]]
        again = settle(out, row, lambda n: rerun(rung, cfg, n), deadline)  # noqa: B023 (called at once)
        out.append(again if again is row or "resident" not in row else {**again, "resident": row["resident"]})
    return out


def dropped(rows: list[dict], plan: list[tuple], pick: str) -> list[str]:
    """The rungs up to `pick` whose change measured slower than the row it changed (by the rule)."""
    names = [rung.name for rung, _, _ in plan]
    upto = names[:names.index(pick) + 1]
    base, got = ladder.compared_with(rows), {r["rung"]: r for r in rows if not r["skipped"]}
    return [n for n in upto if n in got and base.get(n) in got and n != pick
            and noise.relation(ladder.figure(got[n]), ladder.figure(got[base[n]])) == "<"]


def without(plan: list[tuple], pick: str, slower: list[str]) -> tuple[TrainConfig, list[str], list[str]]:
    """The configuration of rung `pick` with the changes of `slower` undone (each key back to the value of the rung
    below it), the rungs undone, and those kept because the configuration needs them (a CUDA graph needs the
    fused optimizer)."""
    configs = {rung.name: cfg for rung, cfg, _ in plan}
    cfg, undone, kept = configs[pick], [], []
    for name in slower:
        i = next(i for i, (r, _, _) in enumerate(plan) if r.name == name)
        rung = plan[i][0]
        below = next((c for _, c, why in reversed(plan[:i]) if why is None or why.startswith("left out")), plan[0][1])
        try:
            cfg = cfg.replace(**{k: getattr(below, k) for k in rung.overrides})
            undone.append(name)
        except UserError:
            kept.append(name)
    return cfg, undone, kept


def recommendation(rows, plan, rec: dict, measure: Callable[[TrainConfig], dict], keys) -> dict:
    """`rec` (card.recommend's) without the changes that measured slower, measured as recommended; `rec` itself
    where nothing measured slower or undoing it fails."""
    slower = dropped(rows, plan, rec["rung"])
    if not slower:
        return rec
    cfg, undone, kept = without(plan, rec["rung"], slower)
    if not undone:
        return {**rec, "kept_slower": kept}
    row = measure(cfg.replace(out_dir=f"{cfg.out_dir.rsplit('/', 1)[0]}/{RECOMMENDED.name}"))
    if row.get("skipped"):
        return {**rec, "kept_slower": slower, "why_kept": row["skipped"]}
    if noise.relation(ladder.figure(row), ladder.figure(rec["row"])) == "<":  # the changes interact: keep them
        return {**rec, "kept_slower": slower, "why_kept": f"without them it measured slower ({row['img_s']:,.1f} "
                                                          "samples/s)"}
    fp32 = next(r for r in rows if r["rung"] == "fp32")
    row = {**row, "rung": rec["rung"], "change": f"{rec['rung']} without {', '.join(undone)}",
           "speedup": row["img_s"] / fp32["img_s"], "precision": cfg.precision}  # named as the rung it stands for
    base = next(c for r, c, _ in plan if r.name == "fp32")
    changes = {k: getattr(cfg, k) for k in keys if getattr(cfg, k) != getattr(base, k)}
    return {**rec, "row": row, "config": cfg, "changes": changes, "dropped": undone, "kept_slower": kept,
            "measured_as_recommended": True}


def sized(sizes, steps: int):
    """The card's sizes with `steps` timed steps (a rung run again to decide)."""
    return dataclasses.replace(sizes, steps=steps, window=min(sizes.window, steps))
