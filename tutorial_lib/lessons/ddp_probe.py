"""The optional case study of notebook 05: DDP at batch 256 per GPU with a compiled, CUDA-graphed step, form by
form, and where the step's time goes on every rank against one GPU.

    python -m tutorial_lib study ddp_probe --reference     # a node with 2 or 4 GPUs: about 6 minutes
    python -m tutorial_lib study ddp_probe --small         # tiny sizes on a CPU: the traced pair only

The forms, each an untraced run on every GPU of the node (N = 2 or 4: the most of those it has; a node with one
GPU runs the one-GPU cases only), one at a time (lessons/cases.py), from DDP's own hooks to the
workbook's whole-step graph: eager DDP; compile_mode=reduce-overhead with DDP's hooks (ddp_sync=hooks) and
the graph cut at the buckets (ddp_compile=split), compiled inside DDP (inner), one graph (whole); the same
with one flat all-reduce after the backward pass (ddp_sync=flat); the whole step as one CUDA graph
(cuda_graph=true), compiled or not, with the flat all-reduce or bucketed during the backward pass. Then the
graphed step traced on one GPU and on every rank, its kernels sorted into tl.roofline's classes.
The record keeps the layout notebook 05 reads: `<form>_img_s`, `<form>_efficiency` (tl.scaling.efficiency
against the same recipe on one GPU, run alone) and `gap_traces`.
"""
from __future__ import annotations

from pathlib import Path

import torch

from . import roofline, scaling
from .cases import Case, Runner, node_gpus
from .dpddp import TRACED, graphed, recipe
from .. import trace_summary
from ..config import UserError

BUDGET_S = 420
FORMS = {  # the forms of DDP at batch 256 per GPU, in the order the case study tells them
    "ddp_eager": "DDP eager: DDP's hooks, nothing compiled",
    "ddp_ro_split": "compile_mode=reduce-overhead, ddp_sync=hooks, ddp_compile=split: the graph cut at the buckets",
    "ddp_ro_inner": "the same, compiled inside DDP (ddp_compile=inner)",
    "ddp_ro_whole": "the same, one compiled graph (ddp_compile=whole)",
    "ddp_ro_flat": "ddp_sync=flat: one flat all-reduce after the backward pass",
    "ddp_graph": "cuda_graph=true: the whole step as one CUDA graph, all-reduce inside",
    "ddp_graph_eager": "the same, not compiled",
    "ddp_graph_buckets": "the same, all-reduced in buckets during the backward pass (ddp_sync=buckets)",
}


def cases(size, gpus: int = 4) -> list[Case]:
    """The forms on a node of `gpus` GPUs (2 or 4: DDP on all of them; 1: the one-GPU cases only)."""
    base = recipe(size)
    ddp, n = base.replace(parallel="ddp"), size.pick(2, gpus)
    ro = dict(compile=not size.small, compile_mode="reduce-overhead")
    trace = dict(TRACED, profile_wait=size.pick(2, 150), profile_active=size.pick(2, 3))
    traced = [Case("1gpu_graph_traced", graphed(base, size).replace(**trace), 1, "1 GPU, whole-step graph, traced"),
              Case("ddp_graph_traced_all", graphed(ddp, size).replace(**trace), n,
                   "DDP, whole-step graph, every rank traced")]
    if size.small:
        return traced
    if n < 2:
        return [Case("1gpu_graph_b256", graphed(base, size), 1, "1 GPU, whole-step graph", estimate_s=45),
                Case("1gpu_reduce-overhead_b256", base.replace(**ro), 1, "1 GPU, reduce-overhead", estimate_s=45)]
    return [
        Case("1gpu_graph_b256", graphed(base, size), 1, "1 GPU, whole-step graph", estimate_s=45),
        Case("1gpu_reduce-overhead_b256", base.replace(**ro), 1, "1 GPU, reduce-overhead", estimate_s=45),
        *(Case(name, cfg, n, FORMS[name], estimate_s=s) for name, cfg, s in (
            ("ddp_eager", ddp, 20),
            ("ddp_ro_split", ddp.replace(**ro, ddp_sync="hooks", ddp_compile="split"), 50),
            ("ddp_ro_inner", ddp.replace(**ro, ddp_sync="hooks", ddp_compile="inner"), 45),
            ("ddp_ro_whole", ddp.replace(**ro, ddp_sync="hooks", ddp_compile="whole"), 45),
            ("ddp_ro_flat", ddp.replace(**ro, ddp_sync="flat"), 45),
            ("ddp_graph", graphed(ddp, size), 35),
            ("ddp_graph_eager", ddp.replace(cuda_graph=True), 25),
            ("ddp_graph_buckets", graphed(ddp, size).replace(ddp_sync="buckets"), 45))),
        *(Case(c.name, c.cfg, c.gpus, c.about, estimate_s=40) for c in traced),
    ]


def study(size, out: Path) -> dict[str, dict]:
    """`python -m tutorial_lib study ddp_probe`: the forms, then the traced pair taken apart kernel class by class."""
    here = 0 if size.small else torch.cuda.device_count()
    runner = Runner(out, size.pick(1800, BUDGET_S), here)
    for case in cases(size, node_gpus(here)):
        runner.run(case)
    runner.save()
    figures: dict = {"recipe": " ".join(recipe(size).to_overrides()), "gpus": size.pick(2, node_gpus(here))}
    singles = [rec["result"] for rec in runner.records.values() if rec.get("result") and rec["gpus"] == 1
               and not rec["result"]["config"]["profile"]]
    for name, rec in runner.records.items():
        r = rec.get("result")
        if not r or r["config"]["profile"]:
            continue
        figures[f"{name}_img_s"] = round(r["throughput_img_s"], 1)
        if rec["gpus"] > 1:
            try:
                figures[f"{name}_efficiency"] = round(scaling.efficiency(r, scaling.best_baseline(singles, r)).efficiency, 3)
            except UserError as e:  # no single-GPU case of its recipe ran: the img/s stands alone
                figures[f"{name}_baseline"] = str(e)
    pair = [runner.runs / name for name in ("1gpu_graph_traced", "ddp_graph_traced_all")]
    if all((d / "tb" / "profile").is_dir() for d in pair):
        figures["gap_traces"] = gap(*pair)
    return {"05_ddp_probe": figures}


def gap(*run_dirs: Path) -> dict:
    """Per rank of each traced run: the step (ms), its parts and its kernels in tl.roofline's classes (ms per
    profiled step), so that one GPU's trace and the DDP ranks' can be subtracted class by class."""
    out = {}
    for d in run_dirs:
        for t in trace_summary.summarize(d, top=100_000):  # every kernel: the classes need them all
            out[f"{Path(d).name}_{t.worker}"] = {
                "step_ms": round(t.step_ms, 3), "parts_ms": {k: round(v, 3) for k, v in t.parts_ms.items()},
                "classes_ms": {k: round(v, 3) for k, v in roofline.kernel_classes(t.top_kernels).items()},
                "kernels_per_step": round(sum(k["calls"] for k in t.top_kernels), 1)}
    return out


def class_gap(figures: dict) -> dict | None:
    """One GPU against the mean of the DDP ranks, class by class (ms per profiled step): {class: (1 GPU, DDP)},
    with the idle time and the whole step; None when the record has no traced pair."""
    g = figures.get("gap_traces")
    if not g:
        return None
    one = next(v for k, v in g.items() if k.startswith("1gpu_"))
    ranks = [v for k, v in g.items() if k.startswith("ddp_")]
    mean = lambda f: sum(f(r) for r in ranks) / len(ranks)  # noqa: E731
    rows = {c: (one["classes_ms"].get(c, 0.0), mean(lambda r: r["classes_ms"].get(c, 0.0)))
            for c in dict.fromkeys([*one["classes_ms"], *ranks[0]["classes_ms"]])}
    rows["idle (no kernel running)"] = (one["parts_ms"]["idle"], mean(lambda r: r["parts_ms"]["idle"]))
    rows["the whole step"] = (one["step_ms"], mean(lambda r: r["step_ms"]))
    return {"ranks": len(ranks), "rows": rows}


def forms(figures: dict) -> list[dict]:
    """The forms a probe record holds, in FORMS' order: what each is, its img/s, and its img/s against eager DDP."""
    eager = figures.get("ddp_eager_img_s")
    return [{"form": name, "about": about, "img_s": figures[f"{name}_img_s"],
             "over_eager": figures[f"{name}_img_s"] / eager if eager else None}
            for name, about in FORMS.items() if f"{name}_img_s" in figures]


def card(record: dict) -> str:
    """'4x NVIDIA H200': the GPUs a record's figures ran on."""
    return f"{record['figures'].get('gpus') or record['gpus']}x {record['card']}"


def card_note(record: dict, section: dict | None) -> str | None:
    """A line where a case-study record ran on another card than `section`'s reference (notebook 05's section
    4): its figures compare within their own table, not across cards. None where the cards are the same."""
    if section is None or card(record) == card(section):
        return None
    return (f"(these ran on {card(record)}, section 4's on {card(section)}: another card, so compare rows within "
            "this table, not with section 4)")
