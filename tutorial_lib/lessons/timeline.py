"""A step's timeline from a torch.profiler trace, offline: what the host and each GPU stream did, and the gaps.

    t = tl.timeline.summary("runs/02_profiling/baseline")   # a run folder or one trace file -> a small dict
    t["idle_share"]                                          # the share of the steps with no GPU work running
    tl.timeline.plot([("this machine", t)])                  # rows: CPU threads, then GPU streams; bars: work

The summary keeps, for the profiled steps of one trace (at most `steps`, on the GPU's clock as
trace_summary cuts them): the engine's phases (data wait, h2d copy, forward, backward, optimizer), the busy
spans of every host thread that ran operators, and the kernels, copies and memsets of every GPU stream, all
in milliseconds from the first step's start. A JSON-sized record, so a GPU run's timeline is a reference
file (notebooks/reference/02_timeline.json, the study `timeline`) that a CPU draws beside its own trace.
Idle share: on a GPU the share of the steps in which no stream runs anything; in a CPU-only trace the share
in which the training thread runs no operator.

The study (python -m tutorial_lib study timeline; scripts/gpu/timeline.sh) profiles notebook 02's run in fp32
and in bf16 + channels_last and keeps both timelines; where `nsys` is installed it also runs the same
configuration under Nsight Systems, the timed window only, and writes `nsys stats` (kernel and NVTX
summaries) to 02_nsys_stats.txt beside the record, else the record says there was no nsys.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from ..config import UserError
from ..intervals import clip, length, union
from ..trace_summary import (DEVICE_CATS, PART_COLORS, PART_LABELS, PARTS, PHASE_LABELS, _device_name, _gpu_step_windows,
                             _launch_times, _main_thread_and_steps, find_traces, read_trace)

MERGE_US = 1.0  # spans closer than this are drawn as one bar (the idle share is computed before merging)
HOST_CATS = ("cpu_op", "operator")


def summary(path: str | os.PathLike, steps: int = 2) -> dict:
    """The timeline of the first `steps` profiled steps of the trace at `path` (a run folder, its tb/profile
    folder or one trace file; a run with several ranks: rank 0's)."""
    if not isinstance(steps, int) or steps < 1:
        raise UserError(f"steps={steps!r} must be a whole number of at least 1, e.g. steps=2")
    file = next(iter(find_traces(path).values()))[0]
    trace = read_trace(file)
    spans = [e for e in trace.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X"
             and "dur" in e and e.get("cat") != "Trace"]
    device = [e for e in spans if e.get("cat", "").lower() in DEVICE_CATS]
    main, windows = _main_thread_and_steps(spans)
    if device:
        windows = _gpu_step_windows(windows, device, _launch_times(spans))
    windows = windows[:steps]
    lo, hi = windows[0][1], windows[-1][2]
    rows = _host_rows(spans, main, lo, hi) + _gpu_rows(device, lo, hi)
    busy = union(iv for r in rows if r["kind"] == ("gpu" if device else "main") for iv in r["raw"])
    for r in rows:
        r["spans"] = _ms(_merged(r.pop("raw")), lo)
    return {"device": _device_name(trace, device), "view": "gpu" if device else "host", "trace": file.name,
            "steps": [[name, round((s - lo) / 1000, 4), round((e - lo) / 1000, 4)] for name, s, e in windows],
            "window_ms": round((hi - lo) / 1000, 4), "phases": _phases(spans, main, lo, hi), "rows": rows,
            "idle_share": round(1 - length(clip(busy, lo, hi)) / (hi - lo), 4) if hi > lo else 0.0}


def _host_rows(spans, main, lo, hi) -> list[dict]:
    """One row per host thread of the training process that ran operators in the window, the training thread
    first (autograd runs backward on a thread of its own)."""
    by_thread = defaultdict(list)
    for e in spans:
        if e.get("cat") in HOST_CATS and e["pid"] == main[0] and e["ts"] < hi and e["ts"] + e["dur"] > lo:
            by_thread[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    order = sorted(by_thread, key=lambda t: (t != main[1], -len(by_thread[t])))
    return [{"name": "CPU: training thread" if t == main[1] else f"CPU: thread {t}",
             "kind": "main" if t == main[1] else "cpu", "raw": clip(union(by_thread[t]), lo, hi)} for t in order]


def _gpu_rows(device, lo, hi) -> list[dict]:
    by_stream = defaultdict(list)
    for e in device:
        a = e.get("args", {})
        by_stream[(a.get("device", e.get("pid")), a.get("stream", e.get("tid")))].append((e["ts"], e["ts"] + e["dur"]))
    return [{"name": f"GPU {dev}: stream {stream}", "kind": "gpu", "raw": clip(union(ivs), lo, hi)}
            for (dev, stream), ivs in sorted(by_stream.items(), key=lambda kv: -len(kv[1]))]


def _phases(spans, main, lo, hi) -> list[list]:
    """[start ms, end ms, part] of the engine's labelled phases on the training thread (PHASE_LABELS)."""
    out = []
    for e in spans:
        part = PHASE_LABELS.get(e["name"])
        if part and (e["pid"], e["tid"]) == main and e.get("cat") == "user_annotation":
            for s, t in clip([(e["ts"], e["ts"] + e["dur"])], lo, hi):
                out.append([round((s - lo) / 1000, 4), round((t - lo) / 1000, 4), part])
    return sorted(out)


def _merged(ivs, gap: float = MERGE_US) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for s, e in ivs:
        if out and s - out[-1][1] < gap:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _ms(ivs, lo) -> list[list[float]]:
    return [[round((s - lo) / 1000, 4), round((e - lo) / 1000, 4)] for s, e in ivs]


def idle_line(where: str, t: dict) -> str:
    """'NVIDIA H200, fp32: the GPU ran nothing for 4% of 2 steps (61.2 ms)' for one summary."""
    who = "the GPU ran nothing" if t["view"] == "gpu" else "the training thread ran no operator"
    return f"{where}: {who} for {t['idle_share']:.0%} of {len(t['steps'])} steps ({t['window_ms']:,.1f} ms)"


def plot(panels: list[tuple[str, dict]]):
    """One timeline per (title, summary), stacked: a row of phases, a row per host thread, a row per GPU
    stream; bars where work ran, white where nothing did, dashed lines between steps. Returns the Figure."""
    import matplotlib.pyplot as plt  # most of a second to import: only plots need it

    if not panels:
        raise UserError("plot() got no timelines; pass [(title, tl.timeline.summary(run_dir)), ...]")
    heights = [len(t["rows"]) + 1.5 for _, t in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(12, 0.45 * sum(heights) + 0.6 * len(panels)), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, (title, t) in zip(axes[:, 0], panels):
        _panel(ax, title, t)
    fig.tight_layout()
    return fig


def _panel(ax, title: str, t: dict) -> None:
    names = ["phases"] + [r["name"] for r in t["rows"]]
    colors = {"gpu": "tab:blue", "main": "0.35", "cpu": "0.6"}
    for part in [p for p in PARTS if any(q == p for *_, q in t["phases"])]:  # copy over data: it lies inside
        ax.broken_barh([(s, e - s) for s, e, p in t["phases"] if p == part], (-0.4, 0.8), color=PART_COLORS[part],
                       linewidth=0, label=PART_LABELS[part])
    for i, r in enumerate(t["rows"], start=1):
        ax.broken_barh([(s, e - s) for s, e in r["spans"]], (i - 0.4, 0.8), color=colors[r["kind"]],
                       linewidth=0)  # no outline: a 3 us kernel stays as thin as it is, the gaps beside it visible
    for _, s, _ in t["steps"][1:]:
        ax.axvline(s, color="k", ls="--", lw=0.8)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, t["window_ms"])
    ax.set_xlabel("ms from the first profiled step's start")
    ax.set_title(idle_line(title, t), fontsize=9)
    if t["phases"]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)


# ------------------------------------------------------------------------------------------ the GPU study
def study(size, out: Path) -> dict:
    """Notebook 02's run profiled in fp32 and bf16 + channels_last (small sizes: fp32 only), both timelines
    and, where nsys is installed, its stats of the same run (see the module's docstring)."""
    from .. import engine
    from .traces import base_config

    out, base = Path(out), base_config(size, out)
    cfg = base.replace(model=size.pick("resnet18_imagenet", "resnet18"), batch_size=size.pick(8, 256),
                       num_workers=size.pick(0, 8), steps=size.pick(4, 9), timing_warmup=size.pick(1, 5),
                       profile_wait=size.pick(1, 5), profile_warmup=1, profile_active=2, tensorboard=False)
    figures: dict = {"timelines": {}}
    for name, keys in (("fp32", {}), ("bf16", {"precision": "bf16", "channels_last": True}))[:size.pick(1, 2)]:
        run = cfg.replace(out_dir=f"{base.out_dir}/timeline_{name}", **keys)
        shutil.rmtree(run.out_dir, ignore_errors=True)
        engine.train(run)
        figures["timelines"][name] = t = summary(run.out_dir)
        print(idle_line(f"{t['device']}, {name}", t), flush=True)
    figures["nsys"] = nsys_stats(cfg.replace(profile=False, nvtx=True, steps=size.pick(4, 20),
                                             out_dir=f"{base.out_dir}/timeline_nsys"), out)
    return {"02_timeline": figures}


def nsys_stats(cfg, out: Path) -> str | None:
    """Run `cfg` under nsys as jobs/02_nsys.sbatch does (the timed window, CUDA graph nodes) and write its kernel
    and NVTX summaries to out/02_nsys_stats.txt. Returns nsys's version line (", failed" added where it failed),
    or None where nsys is missing."""
    nsys = shutil.which("nsys")
    if nsys is None:
        print("nsys: not installed on this machine, so no 02_nsys_stats.txt", flush=True)
        return None
    report = Path(cfg.out_dir) / "nsys" / "timeline"
    report.parent.mkdir(parents=True, exist_ok=True)
    version = subprocess.run([nsys, "--version"], capture_output=True, text=True).stdout.strip() or "nsys"
    try:
        subprocess.run([nsys, "profile", "--trace=cuda,nvtx,osrt", "--capture-range=cudaProfilerApi",
                        "--capture-range-end=stop", "--cuda-graph-trace=node", "--force-overwrite=true",
                        f"--output={report}", sys.executable, "-m", "tutorial_lib", "train", *cfg.to_overrides()],
                       check=True)
        stats = subprocess.run([nsys, "stats", "--report", "nvtx_sum", "--report", "cuda_gpu_kern_sum",
                                "--force-export=true", f"{report}.nsys-rep"], check=True, capture_output=True,
                               text=True)
    except subprocess.CalledProcessError as e:  # the timelines are kept; the record names the failure
        print(f"nsys: {version} failed ({e}); no 02_nsys_stats.txt", flush=True)
        return f"{version}, failed"
    (Path(out) / "02_nsys_stats.txt").write_text(stats.stdout)
    print(f"nsys: {version}; wrote {Path(out) / '02_nsys_stats.txt'}", flush=True)
    return version


def stats_excerpt(text: str, rows: int = 6, width: int = 150) -> str:
    """The top `rows` rows of each report in `nsys stats` text (its title, header and rule kept), lines cut at
    `width`: a screen of the kernel and NVTX summaries instead of every kernel."""
    if not isinstance(rows, int) or rows < 1:
        raise UserError(f"rows={rows!r} must be a whole number of at least 1, e.g. rows=6")
    out, kept = [], None
    for line in text.splitlines():
        if line.lstrip().startswith("** "):  # a report's title: "** CUDA GPU Kernel Summary (cuda_gpu_kern_sum):"
            out += [""] if out else []
            out.append(line.strip())
            kept = 0
        elif kept is not None and line.strip() and kept < rows + 2:  # the header, its rule, then the rows
            out.append(line if len(line) <= width else line[: width - 1] + "~")
            kept += 1
    return "\n".join(out) if out else "(no report in this nsys stats text)"
