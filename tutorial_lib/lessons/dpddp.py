"""Notebook 05's GPU study: DataParallel against DDP, measured on the CIFAR-stem ResNet-18.

    python -m tutorial_lib study dpddp --reference     # a 4-GPU node: at most 5 minutes (a 2-GPU node runs its part)
    python -m tutorial_lib study dpddp --small         # the same code with tiny sizes on a CPU (2 gloo processes)

Every case is an untraced run of the workbook's command line, one at a time with the node to itself
(lessons/cases.py), at batch 256 per GPU unless its words say otherwise, in bf16 + channels_last with the
dataset on the GPU:
  one GPU alone, in each recipe the other runs use: eager; the whole step as one CUDA graph, compiled (the
    step of configs/optimized.yaml); eager at batch 1024;
  DataParallel on 2 and 4 GPUs, each phase of its step timed on the host clock (time_parts=true); on 4 GPUs
    at batch 1024 per GPU (how much of its cost is per step); and with cudnn_benchmark=force (the trap);
  DDP eager and with the whole-step graph on 2 and 4 GPUs; eager on 4 GPUs once more, traced on every rank;
  DDP's knobs on 2 GPUs, each against the same run with the defaults.
Speedup and efficiency come from tl.scaling.efficiency only, against the same recipe on one GPU; the
functions below turn the record into the tables notebook 05 prints.
"""
from __future__ import annotations

from pathlib import Path

from . import scaling
from .cases import Case, Runner, trace_figures
from ..config import TrainConfig, UserError

BUDGET_S = 300  # full size: cases that would start past this are skipped (and say so)
TRACED = dict(profile=True, profile_ranks="all", profile_warmup=1, profile_memory=False, profile_record_shapes=False)


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


def cases(size) -> list[Case]:
    """The study's cases, most telling first (a budget that runs out skips the last)."""
    base, n = recipe(size), size.pick(8, 256)
    dp_steps = dict(steps=size.pick(6, 150), timing_warmup=size.pick(2, 30), time_parts=True)

    def dp(gpus: int, per_gpu: int = n, **kw) -> TrainConfig:  # its one process gets the batch of every GPU
        return base.replace(parallel="dp", batch_size=per_gpu * gpus, **{**dp_steps, **kw})

    ddp, big = base.replace(parallel="ddp"), size.pick(16, 1024)
    trace = dict(TRACED, profile_wait=size.pick(2, 150), profile_active=size.pick(2, 3))
    if size.small:  # one case of each kind the tables read (a traced case: the probe study's small mode)
        return [Case("one_eager", base, 1, "1 GPU, eager"), Case("dp_2", dp(2), 2, "DataParallel, 2 GPUs"),
                Case("ddp_eager_2", ddp, 2, "DDP eager, 2 GPUs")]
    fast = graphed(base, size)
    knob = dict(steps=200, timing_warmup=40)
    return [  # estimates: start-up about 12 s, a cold compile about 20 s, then the timed steps (H100)
        Case("one_eager", base, 1, "1 GPU, eager", estimate_s=20),
        Case("one_graph", fast, 1, "1 GPU, the whole step as one CUDA graph", estimate_s=40),
        Case("dp_2", dp(2), 2, "DataParallel, 2 GPUs", estimate_s=25),
        Case("dp_4", dp(4), 4, "DataParallel, 4 GPUs", estimate_s=30),
        # cuDNN times its algorithms again in every step here (about 1.5 s per step on 4 GPUs): few steps suffice
        Case("dp_4_cudnn", dp(4, cudnn_benchmark="force", steps=16, timing_warmup=4, time_parts=False), 4,
             "DataParallel, 4 GPUs, cudnn_benchmark=force", estimate_s=40),
        Case("ddp_eager_2", ddp, 2, "DDP eager, 2 GPUs", estimate_s=20),
        Case("ddp_eager_4", ddp, 4, "DDP eager, 4 GPUs", estimate_s=25),
        Case("ddp_graph_2", graphed(ddp, size), 2, "DDP, the whole step as one CUDA graph, 2 GPUs", estimate_s=25),
        Case("ddp_graph_4", graphed(ddp, size), 4, "DDP, the whole step as one CUDA graph, 4 GPUs", estimate_s=25),
        Case("one_eager_b1024", base.replace(batch_size=big, steps=100, timing_warmup=20), 1,
             "1 GPU, eager, batch 1024", estimate_s=20),
        Case("dp_4_b1024", dp(4, big, steps=40, timing_warmup=10), 4, "DataParallel, 4 GPUs, batch 1024 per GPU",
             estimate_s=25),
        Case("ddp_eager_4_traced", ddp.replace(**trace), 4, "DDP eager, 4 GPUs, every rank traced", estimate_s=25),
        Case("knob_accum", ddp.replace(grad_accum_steps=4, **knob), 2, "grad_accum_steps=4", estimate_s=20),
        Case("knob_bucket", ddp.replace(ddp_bucket_cap_mb=1, **knob), 2, "ddp_bucket_cap_mb=1", estimate_s=20),
        Case("knob_syncbn", ddp.replace(sync_batchnorm=True, **knob), 2, "sync_batchnorm=true", estimate_s=20),
    ]


def study(size, out: Path) -> dict[str, dict]:
    """`python -m tutorial_lib study dpddp`: every case, then cases.json and dp_vs_ddp.md in `out`."""
    import torch

    runner = Runner(out, size.pick(1800, BUDGET_S), 0 if size.small else torch.cuda.device_count())
    for case in cases(size):
        rec = runner.run(case)
        if rec.get("result") and rec["result"]["config"].get("profile"):
            rec["trace"] = trace_figures(Path(runner.runs) / case.name)
    runner.save()
    figures = {"recipe": " ".join(recipe(size).to_overrides()), "batch_per_gpu": size.pick(8, 256),
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
    return (f"(no reference run recorded yet: on a 4-GPU node `python -m tutorial_lib study {study_name} --reference` "
            "writes it)")


# ---------------------------------------------------------------------------------------- reading the record
def spread(result: dict) -> float:
    """Half the p10-p90 range of a run's step times, relative to its median: how far its img/s may wander."""
    s = result["step_time_ms"]
    return (s["p90"] - s["p10"]) / (2 * s["median"]) if s.get("median") else 0.0


def relation(ratio: float, noise: float, than: str) -> str:
    """'slower than X' / 'faster than X' / 'within noise of X' for a ratio of img/s and its noise."""
    if ratio < 1 - noise:
        return f"slower than {than}"
    return f"faster than {than}" if ratio > 1 + noise else f"within noise of {than}"


def comparison(figures: dict, name: str) -> dict | None:
    """A multi-GPU case against the same recipe on one GPU (tl.scaling.best_baseline + efficiency), or None
    when it did not run or no single-GPU case holds its recipe."""
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
    return {"case": name, "about": rec["about"], "gpus": p.gpus, "batch_per_gpu": p.batch_per_gpu,
            "img_s": p.img_s, "baseline": figures["cases"][base_name]["about"],
            "baseline_img_s": base["throughput_img_s"], "speedup": p.speedup, "efficiency": p.efficiency,
            "verdict": relation(p.speedup, max(spread(run), spread(base)), "one GPU")}


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
    """The comparison as a Markdown table: img/s, the same recipe on one GPU beside it, speedup, efficiency."""
    lines = ["| run | GPUs | batch per GPU | img/s | the same on 1 GPU, img/s | speedup | efficiency | verdict |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows(figures, parallel):
        lines.append(f"| {r['about']} | {r['gpus']} | {r['batch_per_gpu']} | {r['img_s']:,.0f} | "
                     f"{r['baseline_img_s']:,.0f} ({r['baseline']}) | {r['speedup']:.2f}x | {r['efficiency']:.2f} | "
                     f"{r['verdict']} |")
    return "\n".join(lines)


def skipped(figures: dict) -> list[str]:
    """'<what>: <why>' for every case that did not give a figure."""
    return [f"{rec['about']}: {rec['status']}" for rec in figures["cases"].values() if not rec.get("result")]


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


def per_step_overhead(figures: dict) -> list[dict]:
    """DataParallel's step against one GPU's at the same batch per GPU: what it adds per step, at 256 and 1024."""
    out = []
    for dp, one in (("dp_4", "one_eager"), ("dp_4_b1024", "one_eager_b1024")):
        a, b = (figures["cases"].get(k, {}).get("result") for k in (dp, one))
        if a and b:
            out.append({"batch_per_gpu": b["global_batch"], "dp_step_ms": a["step_time_ms"]["median"],
                        "one_gpu_step_ms": b["step_time_ms"]["median"],
                        "extra_ms": a["step_time_ms"]["median"] - b["step_time_ms"]["median"]})
    return out


def trap(figures: dict) -> dict | None:
    """DataParallel with cudnn_benchmark=force against the same run with the engine's setting (off under it)."""
    plain, forced = (figures["cases"].get(k, {}).get("result") for k in ("dp_4", "dp_4_cudnn"))
    if not (plain and forced):
        return None
    ratio = forced["throughput_img_s"] / plain["throughput_img_s"]
    return {"plain_img_s": plain["throughput_img_s"], "forced_img_s": forced["throughput_img_s"],
            "forced_step_ms": forced["step_time_ms"]["median"], "ratio": ratio,
            "verdict": relation(ratio, max(spread(plain), spread(forced)), "the engine's setting")}


def knob_rows(figures: dict) -> list[dict]:
    """Each knob case against DDP eager with the defaults on as many GPUs, with the noise of both."""
    base = figures["cases"].get("ddp_eager_2", {}).get("result")
    out = []
    for name, rec in figures["cases"].items():
        r = rec.get("result")
        if name.startswith("knob_") and r and base:
            ratio = r["throughput_img_s"] / base["throughput_img_s"]
            out.append({"knob": rec["about"], "img_s": r["throughput_img_s"], "defaults_img_s": base["throughput_img_s"],
                        "ratio": ratio, "verdict": relation(ratio, max(spread(r), spread(base)), "the defaults")})
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
