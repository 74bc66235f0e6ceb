"""The optimization ladder of notebook 04: the CIFAR-stem ResNet-18 made faster one change at a time, each rung
one change on top of the last, every rung a real training run (`engine.train`) in this process on this device.

    python -m tutorial_lib ladder                   # the whole ladder on this GPU: about 5-6 minutes on an H100/H200
    python -m tutorial_lib ladder --small           # every rung a CPU can run, with tiny sizes: under a minute
    python -m tutorial_lib ladder dataset=cifar10   # key=value changes the base (the fp32 rung) of every rung
    python -m tutorial_lib study ladder --reference # the GPU study: the ladder, its traces and the bench at
                                                    # configs/optimized.yaml into notebooks/reference/04_ladder*.json

fp32 (TF32 off; in NGC containers NVIDIA_TF32_OVERRIDE=0 forces it off too) -> TF32 -> bf16 autocast ->
channels_last -> fused AdamW -> torch.compile -> mode reduce-overhead (CUDA graphs) -> the whole step as one
CUDA graph (cuda_graph=true) -> batch 1024 -> the GPU-resident input of notebook 03. Beside the ladder: fp16 +
GradScaler instead of bf16; the last rung at batch 256; and the ceiling, the last rung's compiled step in a bare
loop with none of the engine around it. Each row: img/s, step time (median, p10, p90), peak memory, MFU, compile
time and the loss after its steps. (docs/performance.md is rendered from its records by `perfdoc`.)
"""
from __future__ import annotations

import contextlib
import io
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from . import bench, noise, roofline
from .size import Size
from .. import config, data, engine, models, peaks, perfdoc, reference, trace_summary
from ..config import TrainConfig, UserError, default_workers
from ..meters import StepClock, timing_fields, untimed_steps
from ..precision import autocast, cpu_bf16_native, cpu_bf16_note
from ..results import Result, atomic_write_text, load_result


@dataclass(frozen=True)
class Sizes:
    batch: int  # the workbook's default per-GPU batch
    big_batch: int  # the larger-batch rung
    steps: int  # steps of every rung at `batch` (the same for all, so their losses compare)
    big_steps: int  # steps at `big_batch`
    warmup: int  # untimed steps first (compiled rungs: at least engine.COMPILE_WARMUP)
    model: str
    train_size: int | None
    budget_s: float  # rungs that would start after this many seconds are skipped (a time cap for the whole ladder)
    bench_steps: int = 200  # the study's bench at configs/optimized.yaml: timed steps per measure ...
    bench_window: int = 20  # ... in windows of this many steps


GPU = Sizes(batch=256, big_batch=1024, steps=150, big_steps=60, warmup=10, model="resnet18", train_size=None,
            budget_s=330)
SMALL = Sizes(batch=16, big_batch=64, steps=8, big_steps=4, warmup=2, model="resnet18_imagenet", train_size=256,
              budget_s=480, bench_steps=4, bench_window=2)
# The study skips its bench when the ladder and its traces took longer than this: a call on the lent GPU machines
# runs at most 10 minutes, and the bench takes about 2.
BENCH_AFTER_S = 450


def sizes_for(size: Size) -> Sizes:
    """The ladder's sizes at the workbook's size (lessons.size): SMALL or GPU."""
    return size.pick(SMALL, GPU)


@dataclass(frozen=True)
class Rung:
    name: str
    change: str  # what this rung changes, in the learner's words
    overrides: dict = field(default_factory=dict)
    on: str | None = None  # a row beside the ladder: the rung it changes (None: on top of the previous rung)
    cpu_note: str | None = None  # why it can't run on a CPU (None: it can)
    bare: bool = False  # the ceiling row: a bare loop instead of the engine


def rungs(sizes: Sizes) -> list[Rung]:
    return [
        Rung("fp32", "fp32, TF32 off: the honest baseline", {"precision": "fp32"}),
        Rung("tf32", "TF32: fp32 matmuls and convolutions on tensor cores", {"precision": "tf32"},
             cpu_note="TF32 is a mode of NVIDIA tensor cores"),
        Rung("bf16", "bf16 autocast", {"precision": "bf16"}),
        Rung("channels_last", "channels_last (NHWC) memory layout", {"channels_last": True}),
        Rung("fused_adamw", "fused AdamW (one kernel) instead of foreach", {"optimizer_impl": "fused"}),
        Rung("compile", "torch.compile, mode default", {"compile": True}),
        Rung("reduce_overhead", "compile mode reduce-overhead: CUDA graphs", {"compile_mode": "reduce-overhead"},
             cpu_note="CUDA graphs need a GPU"),
        Rung("step_graph", "the whole step (with the optimizer) as one CUDA graph, compile mode default inside",
             {"compile_mode": "default", "cuda_graph": True}, cpu_note="CUDA graphs need a GPU"),
        Rung("big_batch", f"batch {sizes.batch} -> {sizes.big_batch}", {"batch_size": sizes.big_batch}),
        Rung("gpu_resident", "GPU-resident input and augmentation (notebook 03)", {"loader": "gpu_resident"}),
        Rung("last_small_batch", f"beside the ladder: the last rung at batch {sizes.batch}", {"batch_size": sizes.batch},
             on="gpu_resident"),
        Rung("bare_loop", "ceiling: the last rung's compiled step in a bare loop", on="gpu_resident", bare=True),
        Rung("fp16", "beside the ladder: fp16 + GradScaler instead of bf16", {"precision": "fp16"}, on="bf16",
             cpu_note="fp16 autocast needs a CUDA GPU here"),
    ]


def base_config(sizes: Sizes, overrides: dict | None = None) -> TrainConfig:
    """The fp32 rung: what every later rung changes one key at a time."""
    return TrainConfig(**{
        "dataset": "shapes", "model": sizes.model, "train_size": sizes.train_size, "batch_size": sizes.batch,
        "optimizer_impl": "foreach", "num_workers": default_workers(), "eval": False, "tensorboard": False,
        "progress": False, "resume": False, "timing_warmup": sizes.warmup, "log_every": sizes.steps,
        "out_dir": "runs/04_ladder", **(overrides or {})})


def configs(sizes: Sizes, overrides: dict | None = None, device: str = "cuda", compile_on_cpu: bool = False,
            bf16_on_cpu: bool | None = None) -> list[tuple[Rung, TrainConfig, str | None]]:
    """Every rung with its config and why it is skipped on `device` (None: it runs). A skipped rung of the
    ladder adds nothing to the rungs above it. bf16_on_cpu: whether the bf16 rung runs off a GPU (None: where
    this CPU has bf16 instructions, precision.cpu_bf16_native; a job array's nodes decide for themselves)."""
    base = base_config(sizes, overrides)
    out, current, by_name = [], base, {}
    for rung in rungs(sizes):
        start = by_name[rung.on] if rung.on else current
        cfg = start.replace(**rung.overrides)
        steps = sizes.big_steps if cfg.batch_size == sizes.big_batch else sizes.steps
        # the batches DataLoader workers load before the clock starts are left out of the timing (as the bench does)
        ahead = 0 if cfg.loader == "gpu_resident" else cfg.workers() * cfg.prefetch_factor  # workers(): auto too
        cfg = cfg.replace(steps=steps + ahead, timing_warmup=sizes.warmup + ahead, out_dir=f"{base.out_dir}/{rung.name}")
        reason = None
        if device != "cuda" and rung.cpu_note:
            reason = rung.cpu_note
        elif device != "cuda" and rung.overrides.get("precision") == "bf16" and not (
                cpu_bf16_native() if bf16_on_cpu is None else bf16_on_cpu):
            reason = cpu_bf16_note()
        elif device != "cuda" and cfg.compile and not compile_on_cpu:
            reason = "torch.compile takes minutes on a small CPU (compile_on_cpu=True includes it)"
        by_name[rung.name] = cfg
        if rung.on is None and reason is None:
            current = cfg
        out.append((rung, cfg, reason))
    return out


def run(sizes: Sizes = GPU, overrides: dict | None = None, only: list[str] | None = None,
        compile_on_cpu: bool = False, quiet: bool = False) -> list[dict]:
    """Measure the ladder in this process; one row (a dict) per rung, skipped ones with their reason."""
    plan = configs(sizes, overrides, device_type(overrides), compile_on_cpu)
    unknown = set(only or []) - {r.name for r, _, _ in plan}
    if unknown:
        raise UserError(f"no rung named {sorted(unknown)[0]!r}; the rungs are {', '.join(r.name for r, _, _ in plan)}")
    rows, start = [], time.perf_counter()
    for rung, cfg, reason in plan:
        if only and rung.name not in only:
            continue
        if reason is None and time.perf_counter() - start > sizes.budget_s:
            reason = f"the ladder's time budget ({sizes.budget_s:.0f} s) was spent"
        row = skipped_row(rung, cfg, reason) if reason else measure(rung, cfg)
        rows.append(row)
        if not quiet:
            print(row_line(row), flush=True)
    add_speedups(rows)
    return rows


def study(size: Size, out: Path) -> dict[str, dict]:
    """`python -m tutorial_lib study ladder`: every rung, the traces of the TRACED rungs (ladder.json and
    ladder.md in `out`), then notebook 03's bench at configs/optimized.yaml; the figures go to 04_ladder and
    the card's own 04_ladder_<card> (docs/performance.md renders those: `python -m tutorial_lib ladder --doc`)."""
    sizes, started = sizes_for(size), time.perf_counter()
    overrides = {"out_dir": str(Path(out) / "runs")}
    rows = run(sizes, overrides)
    trace = traces(sizes, overrides)
    save(rows, out, trace)
    print(markdown(rows), "", "targets: " + json.dumps(headline(rows)), sep="\n", flush=True)
    figures = reference_figures(rows, trace)
    spent = time.perf_counter() - started
    if spent > BENCH_AFTER_S:
        print(f"bench at configs/optimized.yaml skipped: {spent:.0f} s spent on the ladder already")
    else:
        figures["bench_optimized"] = bench_optimized(sizes, overrides)
    device = next(r["device"] for r in rows if not r["skipped"])
    return dict.fromkeys(reference_names("04_ladder", device), figures)


def bench_optimized(sizes: Sizes, overrides: dict | None = None) -> dict:
    """Notebook 03's bench (IO / SYNTHETIC / FULL) at configs/optimized.yaml, with the DataLoader and with
    GPU-resident input; at small sizes the model, batch and images of `sizes`, uncompiled off a GPU."""
    cfg = optimized_config(sizes, overrides)
    figures = {}
    for loader in ("dataloader", "gpu_resident"):
        if cfg.compile:
            torch._dynamo.reset()  # compiled afresh, as each rung: the ladder's compilations are not its cache
        r = bench.bench(cfg.replace(loader=loader, out_dir=f"{cfg.out_dir}/bench_{loader}"), steps=sizes.bench_steps,
                        window=sizes.bench_window)
        print(f"-- bench at configs/optimized.yaml, loader={loader}\n{r.summary()}", flush=True)
        figures[loader] = {"device": r.device, **{m: f.img_s for m, f in r.figures.items()},
                           "full_over_synthetic": r.img_s("full") / r.img_s("synthetic"), "verdict": r.verdict,
                           "windows": {m: f.window_img_s for m, f in r.figures.items()},  # to judge it again
                           "waited": r.full_data_wait_fraction}
    return figures


def optimized_config(sizes: Sizes, overrides: dict | None = None) -> TrainConfig:
    """configs/optimized.yaml for the bench; at small sizes the model, batch and images of `sizes`, uncompiled off a
    GPU, and in fp32 on a CPU without bf16 instructions (precision.cpu_bf16_note says why)."""
    cfg = config.load(config.CONFIGS_DIR / "optimized.yaml").replace(
        progress=False, tensorboard=False, num_workers=default_workers(), **(overrides or {}))
    if sizes != GPU:
        cuda = device_type(overrides) == "cuda"
        cfg = cfg.replace(model=sizes.model, batch_size=sizes.big_batch, train_size=sizes.train_size,
                          compile=cfg.compile and cuda)
        if not cuda and cfg.precision == "bf16" and not cpu_bf16_native():
            cfg = cfg.replace(precision="fp32")
    return cfg


def device_type(overrides: dict | None = None) -> str:
    """'cuda' where the rungs will run on a GPU (device=auto with one visible, or device=cuda), else 'cpu'."""
    return "cuda" if torch.cuda.is_available() and (overrides or {}).get("device", "auto") != "cpu" else "cpu"


def measure(rung: Rung, cfg: TrainConfig) -> dict:
    """One rung: a training run (or the bare loop) from a clean compiler cache, its figures as a row."""
    if cfg.compile:
        torch._dynamo.reset()  # each compiled rung compiles afresh: its compile time is its own
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # the run's own "step k/N loss" line
        result = bare_loop(cfg) if rung.bare else engine.train(cfg)
    return row(rung, cfg, result, time.perf_counter() - t0)


def bare_loop(cfg: TrainConfig) -> Result:
    """The ceiling: the engine's model (compiled as cfg says), optimizer and input, stepped by the smallest
    loop that trains: no scheduler, loss log, progress, profiler hook, signal handling or checkpoints. Timed
    with the engine's clock (meters.StepClock, one CUDA event per step) and figures, so the two compare."""
    with engine.prepared_run(cfg) as r:
        model, opt, batches = r.model, r.opt, r.batches()
        clock = StepClock(r.device, untimed_steps(cfg, cfg.timing_warmup), time_first=cfg.compile)
        clock.start()
        for _ in range(cfg.steps):
            x, y = next(batches)
            if r.graphed is not None:  # cuda_graph=true: the same recorded step, replayed
                loss = r.graphed(x, y)
                clock.tick()
                continue
            with autocast(cfg, r.device):
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            clock.tick()
        timing = timing_fields(clock, r.batch_size, r.env)
        channels, size, *_ = data.SPECS[cfg.dataset]
        flops = models.flops_per_image(cfg.model, data.num_classes(cfg.dataset), (channels, size, size))
        device = engine.device_name(r.device)
        peak = torch.cuda.max_memory_allocated(r.device) / 2**20 if r.device.type == "cuda" else None
        return Result(
            config=cfg.to_dict(), device=device, world_size=1, steps=cfg.steps, global_batch=r.batch_size, **timing,
            loss=[], final_loss=loss.item(), val_accuracy=None, peak_memory_mb=peak,
            param_checksums=[], resumed_from_step=None, wall_time_s=0.0, torch_version=torch.__version__,
            compile_time_s=clock.first_step_s, flops_per_image=flops,
            mfu=peaks.mfu(timing["throughput_img_s"], flops, device, cfg.precision))


# ------------------------------------------------------------------------------------------------ rows
def row(rung: Rung, cfg: TrainConfig, res: Result, wall_s: float) -> dict:
    """A rung's figures. img/s from the MEAN step time, so that steps that waited for data count (a median
    hides them when fewer than half the steps wait); MFU likewise."""
    t = res.step_time_ms
    img_s = res.global_batch / (t["mean"] / 1000) if t.get("mean") else res.throughput_img_s
    mfu = res.mfu * img_s / res.throughput_img_s if res.mfu and res.throughput_img_s else res.mfu
    return {"rung": rung.name, "change": rung.change, "batch": cfg.batch_size, "steps": res.steps,
            "img_s": img_s, "step_ms": t["median"], "step_ms_p10": t["p10"], "step_ms_p90": t["p90"],
            "step_ms_blocks": t.get("block_ms"),
            "data_wait_ms": res.data_wait_ms, "peak_mb": res.peak_memory_mb, "mfu": mfu, "compile_s": res.compile_time_s,
            "final_loss": res.final_loss, "loss": res.loss, "fp16_skipped_steps": res.fp16_skipped_steps,
            "device": res.device, "wall_s": wall_s, "skipped": None}


def skipped_row(rung: Rung, cfg: TrainConfig, reason: str) -> dict:
    return {"rung": rung.name, "change": rung.change, "batch": cfg.batch_size, "steps": 0, "skipped": reason}


def add_speedups(rows: list[dict]) -> None:
    """Each measured row's speed-up over the fp32 row (None when fp32 was not measured)."""
    base = next((r["img_s"] for r in rows if r["rung"] == "fp32" and not r["skipped"]), None)
    for r in rows:
        if not r["skipped"]:
            r["speedup"] = r["img_s"] / base if base else None


def figure(r: dict) -> noise.Figure:
    """A measured row's img/s as an estimate of the mean, with its interval (noise.of_steps: from the mean step of
    each block of steps, or from the p10/p90 steps of a record that kept only those)."""
    return noise.of_steps(r["img_s"], r["step_ms"], r["step_ms_p10"], r["step_ms_p90"], r.get("steps") or 0,
                          r.get("step_ms_blocks"), r.get("batch"))


def compared_with(rows: list[dict]) -> dict[str, str]:
    """rung -> the measured row it changes: the row it is built on (`Rung.on`), else the last measured rung of
    the ladder above it (a skipped rung adds nothing, so the row above it is the one that changed)."""
    on = {r.name: r.on for r in rungs(GPU)}
    out, above = {}, None
    for r in rows:
        if r["skipped"]:
            continue
        base = on.get(r["rung"]) or above
        if base is not None and base != r["rung"]:
            out[r["rung"]] = base
        if on.get(r["rung"]) is None:
            above = r["rung"]
    return out


def verdicts(rows: list[dict]) -> dict[str, str]:
    """rung -> its img/s against the row it changes, by the rule of noise.compare: 'x2.14 (2.10-2.18), faster
    than fp32' or 'x1.07 (0.98-1.17), within noise of bf16'."""
    return {rung: against(rows, rung, base) for rung, base in compared_with(rows).items()}


def against(rows: list[dict], rung: str, base: str) -> str:
    """The measured row `rung` against the measured row `base` (two runs: noise.compare with its floor):
    'x2.62 (2.55-2.69), faster than fp32', 'x1.09 (0.97-1.22), not settled against tf32: 300 more steps would
    decide'."""
    got = {r["rung"]: r for r in rows if not r["skipped"]}
    r = noise.compare(figure(got[rung]), figure(got[base]))
    said = {"higher": f"faster than {base}", "lower": f"slower than {base}", "equal": f"within noise of {base}"}
    return f"{r}, {said.get(r.verdict) or r.words().replace('not settled', f'not settled against {base}')}"


# ------------------------------------------------------------------------------------------------ as a batch job
def job_sweep(sizes: Sizes, overrides: dict | None = None, device: str = "cuda") -> tuple[TrainConfig, list[dict]]:
    """The ladder as a job array (tl.jobs.write(..., sweep=points)): the base config, and one point per rung
    that runs on `device` with the keys it changes (its out_dir included). The bare loop is not a training
    run: it stays out. Workers are left to the job (one per CPU it gets)."""
    base = base_config(sizes, overrides).replace(num_workers=TrainConfig().num_workers)
    points = []
    # untimed: the batches up to 8 workers (the most default_workers() gives) load ahead, wherever the job runs
    for rung, cfg, reason in configs(sizes, {**(overrides or {}), "num_workers": 8}, device, bf16_on_cpu=True):
        if reason is None and not rung.bare:
            cfg = cfg.replace(num_workers=base.num_workers)
            points.append({k: v for k, v in cfg.to_dict().items() if v != getattr(base, k)})
    return base, points


def gather(out_dir: str | Path, sizes: Sizes) -> list[dict]:
    """Rows from the result.json of each rung's folder under out_dir (a job array's tasks, or ladder runs)."""
    rows = []
    for rung in rungs(sizes):
        folder = Path(out_dir) / rung.name
        if (folder / "result.json").is_file():
            res = load_result(folder)
            rows.append(row(rung, TrainConfig(**res.config), res, res.wall_time_s))
    add_speedups(rows)
    return rows


def row_line(r: dict) -> str:
    if r["skipped"]:
        return f"{r['rung']:15s} skipped: {r['skipped']}"
    return (f"{r['rung']:15s} {r['img_s']:>9,.0f} img/s  step {r['step_ms']:.1f} ms  peak {perfdoc.fmt(r['peak_mb'], ',.0f')} MB"
            f"  MFU {perfdoc.fmt(r['mfu'] and 100 * r['mfu'], '.0f')}%  compile {perfdoc.fmt(r['compile_s'], '.0f', '-')} s"
            f"  ({r['wall_s']:.0f} s)")


def markdown(rows: list[dict]) -> str:
    """The ladder as a markdown table, each rung judged against the row it changes (the CLI, ladder.md)."""
    return perfdoc.ladder_table(rows, verdicts(rows))


def table(rows: list[dict]) -> str:
    """The ladder as notebook 04 shows it: per rung its batch, img/s, speed-up over fp32, the verdict against the
    row it changes, the data wait, its MFU with the peak it is against, and the compile time."""
    said = verdicts(rows)
    lines = ["| rung | batch | img/s | x fp32 | against the row it changes | data wait ms | MFU (of the dense peak, "
             "TFLOP/s) | compile s |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["skipped"]:
            lines.append(f"| {r['rung']} | {r['batch']} | skipped: {r['skipped']} | | | | | |")
            continue
        precision, peak = peak_of(r)
        mfu = f"{100 * r['mfu']:.0f}% of {peak:,.0f} ({precision})" if r.get("mfu") and peak else "n/a"
        lines.append(f"| {r['rung']} | {r['batch']} | {r['img_s']:,.0f} | {perfdoc.fmt(r.get('speedup'), '.2f')} | "
                     f"{said.get(r['rung'], '-')} | {perfdoc.fmt(r.get('data_wait_ms'), '.1f')} | {mfu} | "
                     f"{perfdoc.fmt(r['compile_s'], '.0f', '-')} |")
    return "\n".join(lines)


def save(rows: list[dict], out_dir: str | Path, traces: dict | None = None) -> tuple[Path, Path]:
    """ladder.json (every row, loss curves included, and the trace summaries) and ladder.md (the table)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return (atomic_write_text(out / "ladder.json", json.dumps({"rows": rows, "traces": traces or {}}, indent=1)),
            atomic_write_text(out / "ladder.md", markdown(rows) + "\n"))


# ------------------------------------------------------------------------------------------------ evidence
TRACED = ("channels_last", "gpu_resident", "last_small_batch")  # the bf16 eager step; the last rung (CUDA graphs) at 1024 and 256


def trace_breakdown(cfg: TrainConfig, device: str = "cuda") -> dict:
    """Profile a few steps of `cfg` (after its compile and graph recording) and summarise the trace offline,
    as notebook 02 does: each part's share of the step, and the kernels that take the GPU's time."""
    prof = trace_config(cfg, device)
    if prof.compile:
        torch._dynamo.reset()
    with contextlib.redirect_stdout(io.StringIO()):
        engine.train(prof)
    s = trace_summary.summarize(prof.out_dir, top=100_000)[0]  # every kernel: the classes below need them all
    parts = s.parts_ms
    busy = sum(k["ms"] for k in s.top_kernels) or 1.0
    return {"device": s.device, "view": s.view, "batch": cfg.batch_size, "step_ms": s.step_ms, "bottleneck": s.bottleneck,
            "shares": {p: parts[p] / s.step_ms for p in trace_summary.PARTS},
            "top_kernels": [{"name": k["name"][:120], "calls": k["calls"], "ms": k["ms"], "of_busy": k["ms"] / busy}
                            for k in s.top_kernels[:8]], **roofline.roofline(cfg, s.device, s.step_ms, s.top_kernels)}


def trace_config(cfg: TrainConfig, device: str = "cuda") -> TrainConfig:
    """A rung's config for its trace: 12 steps, the profiler on 3 of them after compile and recording (on a
    CPU, which compiles nothing here: 6 steps, 2 of them profiled). The throughput of so short a run means
    nothing; it only has to time a step (timing_warmup below its steps)."""
    wait, warmup, active, steps, timed_after = (6, 2, 3, 12, 5) if device == "cuda" else (1, 1, 2, 6, 1)
    return cfg.replace(profile=True, profile_wait=wait, profile_warmup=warmup, profile_active=active, steps=steps,
                       timing_warmup=timed_after, profile_memory=False, profile_record_shapes=False,
                       out_dir=f"{cfg.out_dir}_trace")


def traces(sizes: Sizes, overrides: dict | None = None) -> dict:
    """trace_breakdown of the TRACED rungs (a GPU view on a GPU; on a CPU the host view, uncompiled)."""
    device = device_type(overrides)
    plan = {rung.name: cfg for rung, cfg, _ in configs(sizes, overrides, device)}
    out = {}
    for name in TRACED:
        try:
            out[name] = trace_breakdown(plan[name], device)
        except Exception as e:  # the ladder's rows are measured already: keep them, and say what failed
            out[name] = {"error": f"{type(e).__name__}: {e}"[:500]}
    return out


def headline(rows: list[dict]) -> dict:
    """The figures the issue's targets are about, from the rows (None where a row is missing)."""
    got = {r["rung"]: r for r in rows if not r["skipped"]}
    last = got.get("gpu_resident")

    def ratio(a, b):
        return got[a]["img_s"] / got[b]["img_s"] if a in got and b in got else None
    return {"fp32_img_s": got["fp32"]["img_s"] if "fp32" in got else None,
            "last_img_s": last["img_s"] if last else None, "last_speedup": ratio("gpu_resident", "fp32"),
            "last_mfu": last["mfu"] if last else None, "engine_over_bare_loop": ratio("gpu_resident", "bare_loop"),
            "b256_over_big_batch": ratio("last_small_batch", "gpu_resident")}


def card_slug(device: str) -> str:
    """'h100' for 'NVIDIA H100 80GB HBM3', 'h200' for 'NVIDIA H200': the card in a reference file's name."""
    m = re.search(r"\b([A-Z]\d{2,3})\b", device.upper())
    return m.group(1).lower() if m else re.sub(r"[^a-z0-9]+", "_", device.lower()).strip("_")


def reference_names(prefix: str, device: str) -> tuple[str, str]:
    """The reference files a GPU run writes: the one the notebook reads and the card's own, e.g.
    ('04_ladder', '04_ladder_h200')."""
    return prefix, f"{prefix}_{card_slug(device)}"


def shown_reference(prefix: str, device: str, folder=None, default: str | None = None) -> str:
    """The reference notebook 04 shows on `device` (a name as engine.device_name gives it): the card's own run
    where one was recorded ('04_ladder_h200' on an NVIDIA H200), else `default` where that file exists (the
    reference card's run), else `prefix` (on a CPU, or on a card no reference run has measured)."""
    own = reference_names(prefix, device)[1]
    on_gpu = not device.upper().startswith("CPU")
    if on_gpu and reference.path(own, folder).is_file():
        return own
    return default if default and reference.path(default, folder).is_file() else prefix


def precision_of(rung: str) -> str:
    """The precision a rung of the ladder trains in (fp32 with TF32 off, tf32, bf16, fp16): its MFU's peak."""
    plan = {r.name: cfg.precision for r, cfg, _ in configs(GPU)}
    if rung not in plan:
        raise UserError(f"no rung named {rung!r}; the rungs are {', '.join(plan)}")
    return plan[rung]


def peak_of(row: dict) -> tuple[str, float | None]:
    """(precision, dense peak TFLOP/s) a measured row's MFU is against: its rung's precision on its device
    (tutorial_lib/peaks.py; None for a CPU or a card not in the table)."""
    precision = precision_of(row["rung"])
    return precision, peaks.peak_tflops(row["device"], precision)


def reference_figures(rows: list[dict], trace: dict) -> dict:
    """What the study records as notebooks/reference/04_ladder*.json: the headline figures, every row (loss
    curves only for the precision rows the notebook plots) and the trace summaries."""
    keep = {"fp32", "bf16", "fp16"}
    slim = [{k: v for k, v in r.items() if k != "loss" or r["rung"] in keep} for r in rows]
    return {**headline(rows), "rows": slim, "traces": trace}
