"""Notebook 05's GPU study: DataParallel against DDP, measured on the CIFAR-stem ResNet-18.

    python -m tutorial_lib study dpddp --reference     # a node with 2 or 4 GPUs: about 5 minutes
    python -m tutorial_lib study dpddp --reference --only dp_2_cudnn,ddp_eager_2_traced   # cases missing from it
    python -m tutorial_lib study dpddp --small         # the same code with tiny sizes on a CPU (2 gloo processes)

The cases are sized to the node (N = 1, 2 or 4 GPUs: the most of those it has) and each is an untraced run of the
workbook's command line, one at a time with the node to itself (lessons/cases.py), at batch 256 per GPU unless
its words say otherwise, in bf16 + channels_last with the dataset on the GPU:
  one GPU alone, in each recipe the other runs use: eager; the whole step as one CUDA graph, compiled (the
    step of configs/optimized.yaml); eager at batch 1024;
  DataParallel on 2 (and 4) GPUs, each phase of its step timed on the host clock (time_parts=true); on N GPUs
    at batch 1024 per GPU (how much of its cost is per step); and with cudnn_benchmark=force (the trap);
  DDP eager and with the whole-step graph on 2 (and 4) GPUs; eager on N GPUs once more, traced on every rank;
  DDP's knobs on 2 GPUs, each against the same run with the defaults.
Speedup and efficiency come from tl.scaling.efficiency only, against the same recipe on one GPU, judged by the
noise rule (tl.scaling.scaling_verdict); the functions below turn the record into the tables notebook 05 prints
and name, once each, the cases the record lacks (GROUPS) and why.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import torch

from . import noise, scaling
from .cases import Case, Runner, Selection, node_gpus, trace_figures, why_missing
from .scaling_study import shown_band
from ..config import TrainConfig, UserError

BUDGET_S = 480  # full size: cases that would start past this are skipped (and say so); one device call is 600 s
TRACED = dict(profile=True, profile_ranks="all", profile_warmup=1, profile_memory=False, profile_record_shapes=False)
GROUPS = {  # which cell of notebook 05 shows (or names as missing) which cases: every case in exactly one
    "dp": r"dp_\d+", "overhead": r"(one_eager|dp_\d+)_b1024", "trap": r"dp_\d+_cudnn",
    "ddp": r"one_eager|one_graph|ddp_(eager|graph)_\d+", "traced": r"ddp_eager_\d+_traced", "knobs": r"knob_\w+"}


def recipe(size) -> TrainConfig:
    """Every case's base: the eager step at batch 256 per GPU (small: a CPU's tiny version)."""
    return TrainConfig(dataset="shapes", model=size.pick("resnet18_imagenet", "resnet18"),
                       precision=size.pick("fp32", "bf16"), channels_last=size.pick(False, True),
                       loader="gpu_resident", device=size.pick("cpu", "auto"), num_workers=0,
                       train_size=size.pick(256, 16384), batch_size=size.pick(8, 256), steps=size.pick(6, 300),
                       timing_warmup=size.pick(2, 50), log_every=size.pick(3, 100), eval=False, tensorboard=False)


def graphed(cfg: TrainConfig, size) -> TrainConfig:
    """The whole step as one CUDA graph, compiled inside: configs/optimized.yaml's step (a CPU runs it unrecorded
    and uncompiled: compiling takes minutes there)."""
    return cfg.replace(cuda_graph=True, compile=not size.small)


def cases(size, gpus: int = 4) -> list[Case]:
    """The study's cases on a node of `gpus` GPUs (1, 2 or 4), most telling first (a budget that runs out skips
    the last); small: one case of each kind the tables read, on 2 gloo processes."""
    base, n, top = recipe(size), size.pick(8, 256), gpus
    dp_steps = dict(steps=size.pick(6, 150), timing_warmup=size.pick(2, 30), time_parts=True)

    def dp(k: int, per_gpu: int = n, **kw) -> TrainConfig:  # its one process gets the batch of every GPU
        return base.replace(parallel="dp", batch_size=per_gpu * k, **{**dp_steps, **kw})

    ddp, big = base.replace(parallel="ddp"), size.pick(16, 1024)
    trace = dict(TRACED, profile_wait=size.pick(2, 150), profile_active=size.pick(2, 3))
    if size.small:  # one case of each kind the tables read (a traced case: the probe study's small mode)
        return [Case("one_eager", base, 1, "1 GPU, eager"), Case("dp_2", dp(2), 2, "DataParallel, 2 GPUs"),
                Case("ddp_eager_2", ddp, 2, "DDP eager, 2 GPUs")]
    fast, counts = graphed(base, size), [k for k in (2, 4) if k <= top]
    knob = dict(steps=200, timing_warmup=40)
    # estimates: start-up about 12 s, a cold compile about 20 s, then the timed steps (H100)
    out = [Case("one_eager", base, 1, "1 GPU, eager", estimate_s=20),
           Case("one_graph", fast, 1, "1 GPU, the whole step as one CUDA graph", estimate_s=40)]
    out += [Case(f"dp_{k}", dp(k), k, f"DataParallel, {k} GPUs", estimate_s=15 + 5 * k) for k in counts]
    if counts:  # cuDNN times its algorithms again in every step here (about 1.5 s per step on 4 GPUs): few steps
        out.append(Case(f"dp_{top}_cudnn", dp(top, cudnn_benchmark="force", steps=16, timing_warmup=4,
                                              time_parts=False), top, f"DataParallel, {top} GPUs, cudnn_benchmark=force",
                        estimate_s=40))
    out += [Case(f"ddp_eager_{k}", ddp, k, f"DDP eager, {k} GPUs", estimate_s=20 + 2 * k) for k in counts]
    out += [Case(f"ddp_graph_{k}", graphed(ddp, size), k, f"DDP, the whole step as one CUDA graph, {k} GPUs",
                 estimate_s=25) for k in counts]
    out.append(Case("one_eager_b1024", base.replace(batch_size=big, steps=100, timing_warmup=20), 1,
                    "1 GPU, eager, batch 1024", estimate_s=20))
    if counts:
        out += [Case(f"dp_{top}_b1024", dp(top, big, steps=40, timing_warmup=10), top,
                     f"DataParallel, {top} GPUs, batch 1024 per GPU", estimate_s=25),
                Case(f"ddp_eager_{top}_traced", ddp.replace(**trace), top, f"DDP eager, {top} GPUs, every rank traced",
                     estimate_s=25),
                Case("knob_accum", ddp.replace(grad_accum_steps=4, **knob), 2, "grad_accum_steps=4", estimate_s=20),
                Case("knob_bucket", ddp.replace(ddp_bucket_cap_mb=1, **knob), 2, "ddp_bucket_cap_mb=1", estimate_s=20),
                Case("knob_syncbn", ddp.replace(sync_batchnorm=True, **knob), 2, "sync_batchnorm=true", estimate_s=20)]
    return out


def study(size, out: Path, select: Selection | None = None) -> dict[str, dict]:
    """`python -m tutorial_lib study dpddp`: every case (or those `select` names), then cases.json and
    dp_vs_ddp.md in `out`."""
    here = 0 if size.small else torch.cuda.device_count()
    gpus = size.pick(2, node_gpus(here))
    plan = cases(size, gpus)
    if select:
        select.check([c.name for c in plan])
    runner = Runner(out, size.pick(1800, BUDGET_S), here, select)
    for case in plan:
        rec = runner.run(case)
        if rec.get("result") and rec["result"]["config"].get("profile") and "trace" not in rec:
            rec["trace"] = trace_figures(Path(runner.runs) / case.name)
    runner.save()
    figures = {"recipe": " ".join(recipe(size).to_overrides()), "batch_per_gpu": size.pick(8, 256), "gpus": gpus,
               "budget_s": runner.budget_s, "cases": runner.records}
    (Path(out) / "dp_vs_ddp.md").write_text(table(figures) + "\n\n" + knob_table(figures) + "\n")
    return {"05_dp_vs_ddp": figures}


def summary_rows(folder: str | Path) -> list[dict]:
    """The runs a notebook wrote under `folder` (every result.json, tl.scaling.ledger), each multi-GPU run against
    a valid one-GPU run among them (tl.scaling.best_baseline; DataParallel's GPUs: its batch over the one-GPU
    run's), untraced runs only: a summary read from the files, never from a cell's variables."""
    runs = [r for r in scaling.ledger(folder) if not r["config"].get("profile")]
    singles = [r for r in runs if r["world_size"] == 1 and r["config"]["parallel"] == "none"]
    out = []
    for r in runs:
        dp = r["config"]["parallel"] == "dp"
        if r["world_size"] == 1 and not dp:
            continue
        for base in sorted(singles, key=lambda b: -b["throughput_img_s"]):
            gpus = r["global_batch"] // base["global_batch"] if dp else None
            try:
                p = scaling.efficiency(r, base, "weak", gpus)
            except UserError:
                continue
            out.append({"run": r["run"], "parallel": r["config"]["parallel"], "gpus": p.gpus, "img_s": p.img_s,
                        "baseline": base["run"], "baseline_img_s": base["throughput_img_s"],
                        "speedup": p.speedup, "efficiency": p.efficiency,
                        "replicas_identical": len(set(r.get("param_checksums") or [0])) == 1})
            break
    return out


def missing(study_name: str = "dpddp") -> str:
    return (f"(no reference run recorded yet: on a node with 2 or 4 GPUs `python -m tutorial_lib study {study_name} "
            "--reference` writes it)")


# ---------------------------------------------------------------------------------------- reading the record
def record_gpus(record: dict) -> int:
    """The GPUs the record's cases were sized to (older records: the GPUs of the node that wrote it)."""
    return record["figures"].get("gpus") or record["gpus"]


def in_group(name: str, group: str) -> bool:
    return re.fullmatch(GROUPS[group], name) is not None


def not_recorded(figures: dict, group: str, node_gpus: int | None = None) -> list[str]:
    """'<what>: not recorded (<why>)' for every case of `group` that the record lacks a figure of: each cell of
    notebook 05 names its own, so every missing case is named once."""
    return [f"{rec['about']}: not recorded ({why_missing(rec, node_gpus)})" for name, rec in figures["cases"].items()
            if in_group(name, group) and not rec.get("result")]


def versus(a: dict, b: dict, than: str) -> tuple[float, str]:
    """a's img/s over b's, and the rule's verdict (noise.compare of tl.scaling.figure, two runs): 'slower than',
    'faster than', 'within noise of' or 'not settled against' `than`."""
    r = noise.compare(scaling.figure(a), scaling.figure(b))
    words = {"higher": "faster than", "lower": "slower than", "equal": "within noise of"}
    return a["throughput_img_s"] / b["throughput_img_s"], f"{words.get(r.verdict, 'not settled against')} {than}"


def comparison(figures: dict, name: str) -> dict | None:
    """A multi-GPU case against the same recipe on one GPU (tl.scaling.best_baseline + efficiency, judged by
    tl.scaling.scaling_verdict), or None when it did not run or no single-GPU case holds its recipe."""
    rec = figures["cases"].get(name, {})
    run = rec.get("result")
    if not run or run.get("throughput_img_s") is None:
        return None
    gpus = rec["gpus"] if run["config"]["parallel"] == "dp" else None
    singles = {c["case"]: c["result"] for c in figures["cases"].values() if c.get("result") and c["gpus"] == 1
               and c["result"]["config"]["parallel"] == "none"}
    try:
        base = scaling.best_baseline(list(singles.values()), run, "weak", gpus)
    except UserError:
        return None
    p = scaling.efficiency(run, base, "weak", gpus)
    base_name = next(k for k, v in singles.items() if v is base)
    base_rec = figures["cases"][next(k for k, v in singles.items() if v is base)]
    v = scaling.scaling_verdict(run, base, p.gpus, rec.get("bench"), base_rec.get("bench"))
    return {"case": name, "about": rec["about"], "gpus": p.gpus, "batch_per_gpu": p.batch_per_gpu,
            "img_s": p.img_s, "baseline": figures["cases"][base_name]["about"],
            "baseline_img_s": base["throughput_img_s"], "speedup": p.speedup, "efficiency": p.efficiency,
            "efficiency_band": v["efficiency_band"], "verdict": against_one(v)}


def against_one(v: dict) -> str:
    """tl.scaling.scaling_verdict's words, saying also where a run is no faster than one GPU: the rule finds it
    equal to one GPU ('no faster than one GPU'), or can't tell ('not shown faster than one GPU')."""
    words = v["verdict"]
    if "than one GPU" in words or v["vs_one"] not in ("≈", "?"):
        return words
    return words + (", no faster than one GPU" if v["vs_one"] == "≈" else ", not shown faster than one GPU")


def rows(figures: dict, parallel: str | None = None) -> list[dict]:
    """Every multi-GPU case that ran untraced and has a baseline, in the study's order (`parallel`: only the
    DataParallel ("dp") or DDP ("ddp") ones)."""
    out = []
    for name, rec in figures["cases"].items():
        config = (rec.get("result") or {}).get("config", {})
        if parallel and config.get("parallel") != parallel:
            continue
        if rec["gpus"] > 1 and not name.startswith("knob_") and not config.get("profile"):
            row = comparison(figures, name)
            if row:
                out.append(row)
    return out


def table(figures: dict, parallel: str | None = None) -> str:
    """The comparison as a Markdown table: img/s, the same recipe on one GPU beside it, speedup, efficiency with
    the band the runs' step times allow, and the verdict of the noise rule."""
    lines = ["| run | GPUs | batch per GPU | img/s | the same on 1 GPU, img/s | speedup | efficiency (band) | verdict |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows(figures, parallel):
        lo, hi = r["efficiency_band"]
        lines.append(f"| {r['about']} | {r['gpus']} | {r['batch_per_gpu']} | {r['img_s']:,.0f} | "
                     f"{r['baseline_img_s']:,.0f} ({r['baseline']}) | {r['speedup']:.2f}x | {r['efficiency']:.2f} "
                     f"({shown_band(lo, hi)}) | {r['verdict']} |")
    return "\n".join(lines)


def phases(figures: dict, name: str) -> dict | None:
    """A DataParallel case's step cut into its phases on the host clock (ms per step, largest first), the step
    it measured and the share the phases cover."""
    r = figures["cases"].get(name, {}).get("result") or {}
    parts = r.get("host_parts_ms")
    if not parts:
        return None
    named = dict(sorted(((k, v) for k, v in parts.items() if k != "step"), key=lambda kv: -kv[1]))
    step = r["step_time_ms"]["mean"]
    return {"phases_ms": named, "step_ms": step, "covered": sum(named.values()) / step}


def dp_names(figures: dict) -> list[str]:
    """The DataParallel cases at batch 256 per GPU that the record holds a figure of, by GPUs."""
    return [k for k, rec in figures["cases"].items() if in_group(k, "dp") and rec.get("result")]


def per_step_overhead(figures: dict) -> list[dict]:
    """Each recorded DataParallel step against one GPU's at the same batch per GPU: what it adds per step, at
    256 and at 1024 per GPU."""
    out, cases = [], figures["cases"]
    for name, rec in cases.items():
        one = "one_eager_b1024" if name.endswith("_b1024") else "one_eager"
        a, b = rec.get("result"), cases.get(one, {}).get("result")
        if (in_group(name, "dp") or in_group(name, "overhead") and name.startswith("dp_")) and a and b:
            out.append({"gpus": rec["gpus"], "batch_per_gpu": b["global_batch"], "dp_step_ms": a["step_time_ms"]["median"],
                        "dp_band_ms": (a["step_time_ms"]["p10"], a["step_time_ms"]["p90"]),
                        "one_gpu_step_ms": b["step_time_ms"]["median"],
                        "extra_ms": a["step_time_ms"]["median"] - b["step_time_ms"]["median"],
                        "steps_s": _steps_per_second(a)})
    return out


def _steps_per_second(result: dict) -> noise.Figure:
    """A run's steps per second as an estimate of its mean, with its interval (tl.scaling.figure over the batch)."""
    f = scaling.figure(result)
    return noise.Figure(f.value / result["global_batch"], f.se, f.n, None, f.unit)


def step_comparison(overhead: list[dict]) -> str | None:
    """DataParallel's step on the most GPUs at 256 and at 1024 per GPU, by the rule (noise.compare of their steps
    per second): the per-step cost stays the same when the step carries 4x the images. None without both."""
    most = [o for o in overhead if o["gpus"] == max(x["gpus"] for x in overhead)]
    if len({o["batch_per_gpu"] for o in most}) != 2:
        return None
    a, b = sorted(most, key=lambda o: o["batch_per_gpu"])
    r = noise.compare(b["steps_s"], a["steps_s"])
    said = {"equal": "the same step time within noise, with 4x the images in the second",
            "lower": "the larger batch's step is slower", "higher": "the larger batch's step is faster"}
    return (f"on {a['gpus']} GPUs, steps per second at {b['batch_per_gpu']} against {a['batch_per_gpu']} per GPU: "
            f"{r}, {said.get(r.verdict) or r.words()}")


def trap(figures: dict) -> dict | None:
    """DataParallel with cudnn_benchmark=force against the same run with the engine's setting (off under it)."""
    for name, rec in figures["cases"].items():
        forced = rec.get("result")
        plain = figures["cases"].get(name.removesuffix("_cudnn"), {}).get("result")
        if in_group(name, "trap") and forced and plain:
            ratio, verdict = versus(forced, plain, "the engine's setting")
            return {"gpus": rec["gpus"], "plain_img_s": plain["throughput_img_s"], "ratio": ratio, "verdict": verdict,
                    "forced_img_s": forced["throughput_img_s"],
                    "forced_step_ms": forced["step_time_ms"]["mean"]}  # the mean: img/s is the batch over it
    return None


def knob_rows(figures: dict) -> list[dict]:
    """Each knob case against DDP eager with the defaults on as many GPUs, judged by the noise rule."""
    base = figures["cases"].get("ddp_eager_2", {}).get("result")
    out = []
    for name, rec in figures["cases"].items():
        r = rec.get("result")
        if name.startswith("knob_") and r and base:
            ratio, verdict = versus(r, base, "the defaults")
            out.append({"knob": rec["about"], "img_s": r["throughput_img_s"], "defaults_img_s": base["throughput_img_s"],
                        "ratio": ratio, "verdict": verdict})
    return out


def knob_table(figures: dict) -> str:
    lines = ["| knob (DDP eager, 2 GPUs) | img/s | with the defaults | ratio | verdict |", "| --- | ---: | ---: | ---: | --- |"]
    lines += [f"| `{k['knob']}` | {k['img_s']:,.0f} | {k['defaults_img_s']:,.0f} | {k['ratio']:.2f}x | {k['verdict']} |"
              for k in knob_rows(figures)]
    return "\n".join(lines)


def memory(figures: dict) -> list[dict]:
    """GPU memory used per GPU (MiB, nvidia-smi, the timed window) and utilisation, for the rows of `table`."""
    cases = [figures["cases"][r["case"]] for r in rows(figures)]
    return [{"about": rec["about"], **rec["monitor"]} for rec in cases if rec.get("monitor", {}).get("mem_used_mib")]


def rank_traces(figures: dict) -> tuple[str, dict] | tuple[None, None]:
    """The traced DDP case: what it is, and per rank its step parts, NCCL time and host operators per step."""
    for rec in figures["cases"].values():
        if rec.get("trace"):
            return rec["about"], rec["trace"]
    return None, None


# ---------------------------------------------------------------------------------------- the live run
def stand_in(cfg: TrainConfig, nproc: int) -> tuple[TrainConfig, int, str]:
    """What this server runs DDP on: (config, processes, in words): `nproc` GPUs (tl.notebook.gpus_for), or with
    fewer than 2, 2 CPU processes through gloo in the CPU's tiny recipe (ImageNet stem, batch 16, fp32, 8 steps)."""
    if nproc and cfg.device != "cpu" and torch.cuda.device_count() >= nproc:
        return cfg, nproc, f"{nproc} GPUs (NCCL)"
    cpu = cfg.replace(device="cpu", model="resnet18_imagenet", batch_size=16, precision="fp32", channels_last=False,
                      train_size=512, steps=8, timing_warmup=2, log_every=4)
    return cpu, 2, "2 CPU processes (gloo)"


def one_process(cfg: TrainConfig, nproc: int):
    """The recipe in this process, without DDP, with the cores one of `nproc` CPU ranks gets (as tl.launch)."""
    from .. import engine
    from ..config import usable_cpus

    threads = torch.get_num_threads()
    if cfg.device == "cpu":
        torch.set_num_threads(max(1, usable_cpus() // nproc))
    try:
        return engine.train(cfg)
    finally:
        torch.set_num_threads(threads)


def rank_parts(run_dir: str | Path) -> dict[str, dict]:
    """Per rank of a traced run (tl.trace_summary), ms per profiled step in each of trace_summary's parts."""
    from .. import trace_summary

    return {t.worker: dict(t.parts_ms) for t in trace_summary.summarize(run_dir)}


def reference_parts(figures: dict) -> tuple[str | None, dict]:
    """The reference's traced DDP case: what it is, and per rank ms per profiled step in each part."""
    about, ranks = rank_traces(figures)
    return about, {w: t["parts_ms"] for w, t in (ranks or {}).items()}


def _numel(event: dict) -> int | None:
    """The elements of a collective's first tensor, from the trace's shapes (None without them)."""
    dims = event.get("args", {}).get("Input Dims") or [[]]
    first = dims[0][0] if dims[0] and isinstance(dims[0][0], list) else dims[0]
    return math.prod(first) if first else None


def collectives(run_dir: str | Path) -> dict[str, list[tuple[str, int | None, float]]]:
    """Per rank of a traced run: every collective the host called (c10d::...), the elements of its first tensor,
    and its calls per profiled step."""
    from collections import Counter

    from .. import trace_summary

    out = {}
    for worker, files in trace_summary.find_traces(run_dir).items():
        events = trace_summary.read_trace(files[-1])["traceEvents"]
        steps = sum(1 for e in events if str(e.get("name", "")).startswith("ProfilerStep#")) or 1
        calls = Counter((e["name"].removeprefix("c10d::"), _numel(e)) for e in events
                        if e.get("cat") == "cpu_op" and e["name"].startswith("c10d::"))
        out[worker] = [(name, size, c / steps) for (name, size), c in sorted(calls.items(), key=lambda kv: str(kv))]
    return out


def collective_lines(run_dir: str | Path) -> list[str]:
    return [f"{worker}, per step: " + ", ".join(f"{n}" + (f" of {s:,}" if s else "") + f" x{c:g}" for n, s, c in calls)
            for worker, calls in collectives(run_dir).items()]


def memory_sides(figures: dict) -> list[str]:
    """What section 4's memory lines say, by the rule (noise.compare of single figures: the 5% floor): under
    DataParallel GPU 0 against the most any other GPU holds; eager DDP's GPU against DataParallel's GPU 0 on as
    many GPUs at the same batch. The premise question 2 rests on."""
    rec = {r["case"]: r for r in rows(figures)}
    mem = {c: figures["cases"][c].get("monitor", {}).get("mem_used_mib") for c in rec}
    out = []
    said = {"higher": "more than", "lower": "less than", "equal": "about as much as", "not settled": "not settled against"}
    for case, m in mem.items():
        if m and case.startswith("dp_") and len(m) > 1:
            r = noise.compare(noise.Figure.of(m[0]), noise.Figure.of(max(m[1:])))
            out.append(f"{rec[case]['about']}: GPU 0 {m[0]:,.0f} MiB, {said[r.verdict]} any other GPU "
                       f"(at most {max(m[1:]):,.0f} MiB: {r})")
            ddp = mem.get(case.replace("dp_", "ddp_eager_"))
            if ddp:
                d = noise.compare(noise.Figure.of(max(ddp)), noise.Figure.of(m[0]))
                out.append(f"  DDP eager on as many GPUs: at most {max(ddp):,.0f} MiB per GPU, {said[d.verdict]} "
                           f"DataParallel's GPU 0 ({d})")
    return out


def _quietly(run, *args, **kw):
    """run(*args, **kw) with its output held back: the torchrun line is printed, the rest only on a failure."""
    import contextlib
    import io

    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said):
            out = run(*args, **kw)
    except BaseException:
        print(said.getvalue()[-3000:])
        raise
    print(next((line for line in said.getvalue().splitlines() if line.startswith("$ torchrun")), ""), end="")
    return out


def live(cfg: TrainConfig, nproc: int, out: str = "runs/05") -> tuple:
    """The engine's DDP on `nproc` processes (tl.launch) beside the same recipe in one process (one_process):
    (one process's result, DDP's result)."""
    from .. import engine

    single = _quietly(one_process, cfg.replace(out_dir=f"{out}/single"), nproc)
    ddp = _quietly(engine.launch, cfg.replace(out_dir=f"{out}/ddp"), nproc=nproc)
    print()
    return single, ddp


def traced_run(cfg: TrainConfig, nproc: int, out_dir: str = "runs/05/ddp_traced") -> str:
    """DDP again with a trace on every rank, 2 steps recorded near the end (a trace slows the run: its img/s is
    not one to quote). Returns the run's folder, for rank_parts and collectives."""
    from .. import engine

    traced = cfg.replace(out_dir=out_dir, profile=True, profile_ranks="all", profile_warmup=1, profile_active=2,
                         profile_memory=False, profile_wait=max(1, min(100, cfg.steps - 4)))
    _quietly(engine.launch, traced, nproc=nproc)
    print()
    return out_dir


STACK = {  # the parts of tl.trace_summary a rank's bar stacks, in three
    "compute (forward, backward, optimizer, copies)": (("compute", "optimizer", "copy"), "tab:blue"),
    "all-reduce not hidden by compute": (("comm",), "tab:purple"),
    "waiting (idle, data)": (("idle", "data"), "lightgray")}


def stacked(parts_ms: dict) -> dict[str, float]:
    """A rank's step in STACK's three parts, ms per profiled step."""
    return {label: sum(parts_ms.get(p, 0.0) for p in keys) for label, (keys, _) in STACK.items()}


def rank_bars(panels: list[tuple[str, dict]]):
    """One panel per (title, {rank: parts_ms}): each rank's step as a stacked bar (STACK). Returns the Figure."""
    import matplotlib.pyplot as plt

    panels = [(title, ranks) for title, ranks in panels if ranks]
    if not panels:
        raise UserError("rank_bars: no panel has ranks; pass (title, {rank: parts_ms}) pairs from a traced run")
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 2.6), squeeze=False)
    for ax, (title, ranks) in zip(axes[0], panels):
        left = [0.0] * len(ranks)
        for label, (_, color) in STACK.items():
            ms = [stacked(p)[label] for p in ranks.values()]
            ax.barh(range(len(ranks)), ms, left=left, color=color, label=label)
            left = [a + b for a, b in zip(left, ms)]
        ax.set_yticks(range(len(ranks)), list(ranks))
        ax.invert_yaxis()
        ax.set_xlabel("ms per profiled step")
        ax.set_title(title, fontsize=8)
    axes[0][0].legend(fontsize=7, ncol=3, loc="upper left", bbox_to_anchor=(0, -0.3), frameon=False)
    fig.tight_layout()
    return fig


def spread_line(ranks: dict) -> str:
    """In which of STACK's parts the ranks differ most and least (the range over the ranks, ms per step)."""
    parts = [stacked(p) for p in ranks.values()]
    span = {label.split(" (")[0]: (min(p[label] for p in parts), max(p[label] for p in parts)) for label in STACK}
    most, least = max(span, key=lambda k: span[k][1] - span[k][0]), min(span, key=lambda k: span[k][1] - span[k][0])
    return (f"the ranks differ most in {most} ({span[most][0]:.2f}-{span[most][1]:.2f} ms), least in {least} "
            f"({span[least][0]:.2f}-{span[least][1]:.2f} ms)")
