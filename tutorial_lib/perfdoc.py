"""docs/performance.md from the reference files of notebook 04's ladder, and the text pieces it is made of:
the ladder's table, the roofline tables (kernel classes against the card's peak) and what limits the last rung.

    python -m tutorial_lib ladder --doc     # renders docs/performance.md again from notebooks/reference/

Its inputs are `notebooks/reference/04_ladder_<card>.json` (written by `python -m tutorial_lib study ladder
--reference` on each card) and `04_roofline_<card>.json` (`python -m tutorial_lib ladder --roofline
--reference`). No torch here: the document renders on a login node.
"""
from __future__ import annotations

import os
from pathlib import Path

from . import reference
from .config import ROOT
from .results import atomic_write_text

DOC = ROOT / "docs" / "performance.md"
DOC_CARDS = ("H100", "H200")  # the cards docs/performance.md has a section for
MFU_TARGET = 0.45  # notebook 04: the optimized rung at >= 45% MFU
TENSOR_CORE = "tensor-core convolutions and matmuls"  # the kernel classes the roofline rates (lessons.roofline)
NORM_CLASS = "BatchNorm, ReLU, add (fused Triton)"
# The fewest passes a training step makes over each BatchNorm's activations, with ReLU and the residual add fused
# in: forward reads them twice (statistics, then normalise) and writes once; backward reads the incoming gradient
# and the input twice (two reductions, then the gradient) and writes once. A lower bound of the bytes moved.
NORM_PASSES = 8


def pct(v) -> str:
    """A fraction as a whole percentage; n/a for None."""
    return "n/a" if v is None else f"{100 * v:.0f}%"


def fmt(v, spec: str, none: str = "n/a") -> str:
    return none if v is None else format(v, spec)


# ------------------------------------------------------------------------------------------------ the ladder
def ladder_table(rows: list[dict], said: dict[str, str] | None = None) -> str:
    """The ladder as a markdown table (`tl.ladder.markdown`: the notebook and the CLI print it, with `said`, each
    rung's verdict against the row it changes, from `lessons.ladder.verdicts`)."""
    head = ["rung", "change", "batch", "img/s", "x fp32", *(["against the row it changes"] if said is not None else []),
            "step ms: median (p10-p90)", "data wait ms", "peak MB", "MFU", "compile s", "loss after steps"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r["skipped"]:
            cells = [r["rung"], r["change"], str(r["batch"]), f"skipped: {r['skipped']}", *[""] * (len(head) - 4)]
        else:
            cells = [r["rung"], r["change"], str(r["batch"]), f"{r['img_s']:,.0f}", fmt(r.get("speedup"), ".2f"),
                     *([said.get(r["rung"], "-")] if said is not None else []),
                     f"{r['step_ms']:.2f} ({r['step_ms_p10']:.2f}-{r['step_ms_p90']:.2f})",
                     fmt(r.get("data_wait_ms"), ".2f"), fmt(r["peak_mb"], ",.0f"),
                     fmt(r["mfu"] and 100 * r["mfu"], ".1f", "n/a") + ("%" if r["mfu"] else ""),
                     fmt(r["compile_s"], ".1f", "-"), f"{r['final_loss']:.3f} after {r['steps']}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ the roofline
def roofline_lines(t: dict | None, name: str, target: float | None = MFU_TARGET) -> list[str]:
    """A trace's kernel classes against the card's peak (`lessons.roofline.roofline`), as a table and the
    sentence it supports; with a `target` MFU (docs/performance.md), which limit keeps the step below it (None: no
    target, as in the notebooks)."""
    if not t or not t.get("tensor_core_tflops"):
        return []
    peak, step = t["peak_tflops"], t["step_ms"]
    out = ["", f"Kernel classes of rung {name} (batch {t['batch']}), against the card's dense peak of "
               f"{peak:,.0f} TFLOP/s for its precision:", "",
           "| kernel class | ms/step | of the step | achieved | of its roofline |", "|---|---|---|---|---|"]
    for cls, ms in t["classes_ms"].items():
        rate = ("no counted FLOPs", "memory-bound")
        if cls == TENSOR_CORE:
            rate = (f"{t['tensor_core_tflops']:,.0f} TFLOP/s", pct(t["tensor_core_tflops"] / peak))
        elif cls == t.get("norm_class"):
            rate = (f">= {t['norm_tbs']:.2f} TB/s ({t['norm_gb_per_step']:.1f} GB)",
                    f">= {pct(t['norm_tbs'] / t['bandwidth_tbs'])} of {t['bandwidth_tbs']:g} TB/s")
        out.append(f"| {cls} | {ms:.3f} | {pct(ms / step)} | {rate[0]} | {rate[1]} |")
    out.append(_ceiling_sentence(t, target))
    if t.get("norm_class"):
        out.append(_norm_sentence(t))
    return out


def _ceiling_sentence(t: dict, target: float | None) -> str:
    peak, step = t["peak_tflops"], t["step_ms"]
    tc_share, ceiling = t["classes_ms"][TENSOR_CORE] / step, t["tensor_core_tflops"] / peak
    return (f"\nThe whole step reaches {t['step_tflops']:,.0f} TFLOP/s ({pct(t['step_tflops'] / peak)} of peak). The "
            f"tensor-core kernels take {pct(tc_share)} of it at {pct(ceiling)} of peak: with every other kernel and "
            "every gap gone, the step could reach no more than that. " + ("" if target is None else
                f"That is below the {pct(target)} target: the convolution kernels themselves, at these shapes "
                "(32x32 images, 64 to 512 channels), are the first limit; removing the rest can't reach it."
                if ceiling < target else
                f"That is above the {pct(target)} target: the other {pct(1 - tc_share)} of the step (memory-bound "
                "kernels and gaps) is what holds MFU below it."))


def _norm_sentence(t: dict) -> str:
    at_roof = t["norm_gb_per_step"] / t["bandwidth_tbs"]  # ms: the normalisation at the full bandwidth
    best = t["step_ms"] - t["classes_ms"][t["norm_class"]] + at_roof
    return (f"The normalisation kernels ({t['norm_class']}) must move at least {t['norm_gb_per_step']:.1f} GB per "
            f"step ({NORM_PASSES} passes over every BatchNorm's activations), and do it at "
            f"{pct(t['norm_tbs'] / t['bandwidth_tbs'])} or more of the memory bandwidth. At the full bandwidth they "
            f"would take {at_roof:.2f} ms instead of {t['classes_ms'][t['norm_class']]:.2f}: the step would reach at "
            f"most {pct(t['flops_per_step'] / best / 1e9 / t['peak_tflops'])} of peak. Past that, only moving fewer "
            "bytes helps: fewer passes, or no BatchNorm.")


def small_batch_lines(traces: dict) -> list[str]:
    """Why batch 256 runs slower per image than batch 1024, kernel class by kernel class."""
    big, small = traces.get("gpu_resident", {}), traces.get("last_small_batch", {})
    if not all(t.get("tensor_core_tflops") and t.get("norm_tbs") for t in (big, small)):
        return []
    per_image = lambda t: 1000 * t["step_ms"] / t["batch"]  # noqa: E731  (µs)
    return [f"\nPer image, batch {small['batch']} takes {per_image(small):.2f} µs of step time against {per_image(big):.2f} "
            f"at batch {big['batch']} ({per_image(big) / per_image(small):.2f} of its speed). Both steps are graphs with "
            f"little idle time ({pct(small['shares']['idle'])} and {pct(big['shares']['idle'])}), so no host work is left to "
            f"remove: the kernels themselves are slower on a quarter of the rows. The convolutions reach "
            f"{pct(small['tensor_core_tflops'] / small['peak_tflops'])} of peak instead of "
            f"{pct(big['tensor_core_tflops'] / big['peak_tflops'])}, the normalisation "
            f"{pct(small['norm_tbs'] / small['bandwidth_tbs'])} of the bandwidth instead of "
            f"{pct(big['norm_tbs'] / big['bandwidth_tbs'])}: fewer tiles to fill the GPU's multiprocessors, "
            "and fixed costs per kernel (the 4x4 maps of the last stage) that a larger batch spreads thinner."]


# ------------------------------------------------------------------------------------------------ the document
def limits_section(figures: dict) -> list[str]:
    """'What limits the last rung', from the trace summaries the ladder study recorded."""
    tr = {k: v for k, v in (figures.get("traces") or {}).items() if "error" not in v}
    if "gpu_resident" not in tr:
        why = (figures.get("traces") or {}).get("gpu_resident", {}).get("error", "no trace was recorded")
        return [f"(no trace of the last rung: {why})"]
    last, eager = tr["gpu_resident"], tr.get("channels_last")
    clock = "the GPU's clock" if last["view"] == "gpu" else "the host's clock"
    out = [f"A profiled run of the last rung ({last['step_ms']:.2f} ms per step on {clock}, offline summary "
           f"of `tutorial_lib.trace_summary`): {_shares(last)}; the largest part is **{last['bottleneck']}**."]
    if eager:
        plain = next((r for r in figures.get("rows", []) if r["rung"] == "channels_last" and not r["skipped"]), None)
        beside = (f"; unprofiled, the table above gives it {plain['step_ms']:.2f} ms: the profiler's own work on the "
                  "CPU lengthens the step and its idle share" if plain else "")
        out.append(f"Profiled, the bf16 eager step (rung channels_last) was idle {pct(eager['shares']['idle'])} of its "
                   f"{eager['step_ms']:.2f} ms, the CPU launching kernels one by one{beside}; the compiled CUDA-graph "
                   f"step is idle {pct(last['shares']['idle'])}.")
    small = tr.get("last_small_batch")
    if small:
        out.append(f"The same step at batch {small.get('batch', 'n/a')} ({small['step_ms']:.2f} ms): {_shares(small)}.")
    out += kernel_table(last)
    for name in ("gpu_resident", "last_small_batch"):
        out += roofline_lines(tr.get(name), name)
    return out


def _shares(t: dict) -> str:
    return ", ".join(f"{p} {pct(v)}" for p, v in sorted(t["shares"].items(), key=lambda kv: -kv[1]) if v >= 0.005)


def kernel_table(t: dict) -> list[str]:
    return ["", "| GPU kernel of the last rung | calls/step | ms/step | of GPU busy |", "|---|---|---|---|"] + [
        f"| `{k['name'][:90]}` | {k['calls']:g} | {k['ms']:.3f} | {pct(k['of_busy'])} |" for k in t["top_kernels"]]


def bench_section(figures: dict) -> list[str]:
    bench = figures.get("bench_optimized")
    if not bench:
        return []
    out = ["", "Notebook 03's bench at `configs/optimized.yaml` (img/s):", "",
           "| loader | IO | SYNTHETIC | FULL | FULL / SYNTHETIC |", "|---|---|---|---|---|"]
    out += [f"| {name} | {b['io']:,.0f} | {b['synthetic']:,.0f} | {b['full']:,.0f} | {b['full_over_synthetic']:.2f} |"
            for name, b in bench.items()]
    return out


INTRO = ("Generated by `python -m tutorial_lib study ladder --reference` (`scripts/gpu/ladder.sh`) from "
         "`notebooks/reference/04_ladder_<card>.json`; `python -m tutorial_lib ladder --doc` renders it again. "
         "Every row is a training run of the CIFAR-stem ResNet-18 on the generated `shapes` set, one change on "
         "top of the row above, in one process on one card. MFU is the achieved FLOP/s (FLOPs counted by "
         "`torch.utils.flop_counter`) over the card's dense datasheet peak for the row's precision "
         "(`tutorial_lib/peaks.py`).")


def performance_doc(records: list[dict], rooflines: list[dict] = (), cards: list[str] = (),
                    cluster: dict | None = None) -> str:
    """docs/performance.md: the ladder of each reference record (one per card), its targets and its limits;
    `rooflines`: records of `ladder --roofline` (kernel classes against the peak), shown under their card;
    `cards`: pages of notebook 07's card (card.md) of other models, shown at the end; `cluster`: the record of
    the study `cluster` (energy counter, hang drill, CPU binding), before them."""
    out = ["# Performance: notebook 04's optimization ladder on real cards", "", INTRO]
    for rec in records:
        out += card_section(rec, [r for r in rooflines if r["card"] == rec["card"]])
    if not records:
        out += ["", "(no reference run yet: run scripts/gpu/ladder.sh on a GPU node)"]
    for card in (c for c in DOC_CARDS if not any(c in r["card"] for r in records)):
        out += ["", f"## NVIDIA {card}", "", f"No reference run on an {card} yet: `scripts/gpu/ladder.sh` on one "
                                              "writes `04_ladder_" + card.lower() + ".json`, and its table here."]
    return "\n".join(out + cluster_section(cluster) + cards_section(cards)) + "\n"


CARDS_INTRO = ("Notebook 07's card (`tl.card`, `python -m tutorial_lib card`) asks the same questions of any model. "
               "`scripts/gpu/cards.sh` made these pages on a GPU node (each page names its card and torch version); "
               "they are its `card.md` files, kept as `notebooks/reference/07_card_<model>.md`.")


def cards_section(cards: list[str]) -> list[str]:
    """Notebook 07's card of each model, its page one heading level down."""
    if not cards:
        return []
    out = ["", "## Other models: notebook 07's card", "", CARDS_INTRO]
    for page in cards:
        out += ["", *("#" + ln if ln.startswith("## ") else ln for ln in page.strip().splitlines())]
    return out


NCCL_WAIT = (" (after the timeout NCCL's watchdog waits for the flight recorder's dumps, then torchrun gives a rank "
             "that ignores SIGTERM 30 s before it kills it: notebook 05 explains both)")


def cluster_section(rec: dict | None) -> list[str]:
    """The study `cluster` (lessons/cluster.py): each check's figures, or why it could not run on that node."""
    if rec is None:
        return []
    f, g = rec["figures"], lambda d, k, spec: fmt(d.get(k), spec)
    e, h, n = f["energy"], f["hang"], f["numa"]
    out = ["", f"## Cluster checks on {reference.where(rec)}", "",
           "`python -m tutorial_lib study cluster --reference` (`scripts/gpu/cluster.sh`): what a job's energy, a hung "
           "job and CPU binding look like on a real node.", ""]
    out.append("- **Energy counter**: " + (e["why"] if e.get("why") else
               f"NVML's counter {g(e, 'nvml_j', ',.0f')} J over the timed window ({g(e, 'window_s', '.1f')} s), "
               f"nvidia-smi's power.draw integrated over the same window {g(e, 'power_draw_j', ',.0f')} J: ratio "
               f"{g(e, 'ratio', '.4f')} ({'within' if e.get('within_5_percent') else 'outside'} 5%); "
               f"{g(e, 'joules_per_image', '.4f')} J per image at {g(e, 'throughput_img_s', ',.0f')} img/s."))
    out.append("- **Hang drill**: " + (h["why"] if h.get("why") else
               f"{h['backend']}, rank 1 frozen: the run ended {g(h, 'after_freeze_s', '.0f')} s after the freeze with "
               f"dist_timeout_s={h['dist_timeout_s']}{NCCL_WAIT if h['backend'] == 'nccl' else ''}; {h['verdict']}."))
    mode = n.get("mode", "each rank on its GPU's NUMA node")
    out.append("- **CPU binding**: " + (n["why"] if n.get("why") else
               f"DDP on {n['run']['gpus']} GPUs with DataLoader workers, bound ({mode}) against unbound (alternated "
               "twice): "
               + (n.get("verdict") or f"{n['bound_over_unbound']:.2f}x") + " ("
               + ", ".join(f"{k} {v:,.0f}" for k, v in n["img_s"].items()) + " img/s)."))
    return out


def card_section(rec: dict, rooflines: list[dict]) -> list[str]:
    """One card's section: its ladder, its headline ratios, the bench, what limits the last rung, its roofline records."""
    f = rec["figures"]
    mean = all("data_wait_ms" in r for r in f["rows"] if not r["skipped"])  # records before the mean: median
    out = ["", f"## {rec['card']} (torch {rec['torch']}, {rec['date']})", "",
           f"img/s from the {'mean step time (waits for data included)' if mean else 'median step time'} "
           "after the warm-up.", "", ladder_table(f["rows"]), ""]
    speed = "n/a" if f.get("last_speedup") is None else f"{f['last_speedup']:.1f}x"
    ratio = lambda v: "n/a" if v is None else f"{v:.2f}"  # noqa: E731
    out.append(f"The last rung runs at {speed} the fp32 rung and {pct(f.get('last_mfu'))} MFU; batch 256 reaches "
               f"{ratio(f.get('b256_over_big_batch'))} of batch 1024's img/s; the engine reaches "
               f"{ratio(f.get('engine_over_bare_loop'))} of the bare loop's.")
    out += bench_section(f)
    out += ["", "### What limits the last rung", "", *limits_section(f)]
    if any(t.get("tensor_core_tflops") for t in (f.get("traces") or {}).values()):
        return out  # its own traces carry the kernel classes
    for roof in rooflines:
        out += ["", f"### Kernel classes against the roofline (torch {roof['torch']}, {roof['date']}: "
                    "`python -m tutorial_lib ladder --roofline`, its own profiled runs)", "",
                "The table above counted, in each kernel's time per step, the kernels of the steps before the "
                "profiled ones that a GPU running behind the host was still executing (fixed since); the same "
                "kernels from these runs, counted per profiled step:"]
        last = roof["figures"]["traces"].get("gpu_resident", {})
        out += kernel_table(last) if last.get("top_kernels") else []
        for name in ("gpu_resident", "last_small_batch"):  # the compiled rungs (the eager one is launch-bound)
            out += roofline_lines(roof["figures"]["traces"].get(name), name)
        out += small_batch_lines(roof["figures"]["traces"])
    return out


def render(folder: str | os.PathLike | None = None) -> str:
    """The document from the reference files in `folder` (default: notebooks/reference/)."""
    where = Path(folder or reference.FOLDER)
    records = [reference.load(p.stem, where) for p in sorted(where.glob("04_ladder_*.json"))]
    rooflines = [reference.load(p.stem, where) for p in sorted(where.glob("04_roofline_*.json"))]
    cards = [p.read_text() for p in sorted(where.glob("07_card_*.md"))]
    cluster = reference.load("06_cluster_checks", where) if (where / "06_cluster_checks.json").is_file() else None
    return performance_doc(records, rooflines, cards, cluster)


def write(path: str | os.PathLike = DOC, folder: str | os.PathLike | None = None) -> Path:
    """Render the document from `folder`'s reference files into `path` (default: docs/performance.md)."""
    return atomic_write_text(Path(path), render(folder))
