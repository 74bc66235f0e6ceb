"""The input as a rung's limit (tl.card, lessons/card.py): which of your batches or your model caps each rung.

Every rung trains on your batches (your function, Dataset or DataLoader). A rung whose steps waited for batches
for more than WAIT_SHARE of its time (a fifth) is trained again on one batch resident on the device, reused every
step: the model alone. Where the model alone is faster by the rule (lessons.noise), the input caps that rung; where
the steps hardly waited, the model does (no second run: the batches were there when the step wanted them).
Where the rule can't yet tell the model alone from the rung, the model alone runs again for about as long as the
rung's timed steps took (alone_steps): a few steps of a fast model are one stalled step away from "not settled".
"""
from __future__ import annotations

from typing import Callable

import torch

from . import ladder, noise
from .. import engine, ownmodel
from ..config import TrainConfig

WAIT_SHARE = 0.2  # of a rung's mean step spent waiting for a batch, beyond which the model alone is measured too
ALONE_MAX_STEPS = 2000  # timed steps of the model alone's second run at most
KEPT = ("img_s", "step_ms", "step_ms_p10", "step_ms_p90", "step_ms_blocks", "steps", "batch", "data_wait_ms")


def resident_parts(parts: ownmodel.Parts, cfg: TrainConfig) -> ownmodel.Parts | None:
    """Your parts with the first of your batches, on the run's device, as the source of every step; None when your
    source is already one batch."""
    if not callable(parts.source) and not isinstance(parts.source, (torch.utils.data.Dataset,
                                                                     torch.utils.data.DataLoader)):
        return None
    inp = ownmodel.UserInput(parts.source, cfg.batch_size, 0, False)
    batches = inp.epoch(0)
    x, y = next(batches)
    batches.close()
    device = engine.distributed.pick_device(cfg.device)
    return ownmodel.Parts(parts.factory, (x.to(device), y.to(device)), parts.loss, parts.flops_per_sample)


def waited(row: dict) -> float:
    """The share of a measured rung's mean step spent waiting for its batch."""
    step_ms = 1000 * row["batch"] / row["img_s"] if row.get("img_s") else 0.0
    return (row.get("data_wait_ms") or 0.0) / step_ms if step_ms else 0.0


def alone_steps(row: dict, alone: dict, steps: int) -> int:
    """Timed steps of the model alone's second run: as many of its median step (`alone`: its first run) as fill the
    time the rung's `steps` timed steps took; at least 2 x `steps`, at most ALONE_MAX_STEPS."""
    rung_ms = steps * 1000 * row["batch"] / row["img_s"]
    return int(min(ALONE_MAX_STEPS, max(2 * steps, rung_ms / max(alone["step_ms"] or 0.0, 1e-3))))


def add_resident(row: dict, measure: Callable[[int], dict] | None, steps: int) -> dict:
    """`row` with the model alone (`measure(n)`: the rung on one resident batch for n timed steps) where its `steps`
    timed steps waited, else as is; measured again for longer (alone_steps) where the rule can't yet tell."""
    if measure is None or row.get("skipped") or waited(row) <= WAIT_SHARE:
        return row
    alone = measure(steps)
    if not alone.get("skipped") and cap({**row, "resident": alone}) == "not settled":
        again = measure(alone_steps(row, alone, steps))
        alone = alone if again.get("skipped") else again
    return {**row, "resident": None if alone.get("skipped") else {k: alone.get(k) for k in KEPT}}


def cap(row: dict) -> str | None:
    """'input' where the model alone was faster than the rung on your batches by the rule, 'not settled' where the
    rule can't yet tell, else 'model'; None for a rung that did not run."""
    if row.get("skipped"):
        return None
    alone = row.get("resident")
    said = noise.relation(ladder.figure(alone), ladder.figure(row)) if alone else "≈"
    return {">": "input", "?": "not settled"}.get(said, "model")


def cap_cell(row: dict) -> str:
    """The table's cell: what caps the rung, with the model alone's samples/s where it was measured."""
    what = cap(row)
    if what is None:
        return ""
    alone = row.get("resident")
    share = f"waited {100 * waited(row):.0f}% of the step"
    if not alone:
        return f"model ({share})"
    return f"{what}: the model alone {alone['img_s']:,.1f} ({share})"


def verdict(rows: list[dict], rec_rung: str, io_s: float | None) -> str | None:
    """One line where the input caps the recommended rung: what your batches deliver and what the model alone
    reaches; None where the model caps it."""
    r = next((x for x in rows if x["rung"] == rec_rung), None)
    if r is None or cap(r) != "input":
        return None
    io = f"your batches arrive at {io_s:,.0f} samples/s; " if io_s else ""
    return (f"{io}the model alone reaches {r['resident']['img_s']:,.1f} samples/s at {rec_rung}, on your batches "
            f"{r['img_s']:,.1f}: speed up the input first")
