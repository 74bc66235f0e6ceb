"""The driver of scripts/gpu/dp_vs_ddp.sh (read its header): notebook 05's GPU figures, from one run on a 4-GPU
node, into notebooks/reference/05_dp_vs_ddp.json (and $OUT)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ddp_cases import CPU, OUT, Cases, best_singles, efficiency, summarize_traces, table  # noqa: E402

from tutorial_lib import intervals, reference, trace_summary  # noqa: E402

B = 256  # per GPU, every case unless named
DDP = dict(parallel="ddp")


def dp(n: int) -> dict:
    """DataParallel over n GPUs: its one process gets batch B x n, so that each GPU gets B."""
    return dict(parallel="dp", batch_size=B * n, steps=150, timing_warmup=30)


FAST = dict(compile=True, compile_mode="reduce-overhead")  # CUDA graphs; under DDP the engine's ddp_sync=auto: flat
TRACE = dict(profile=True, profile_ranks="all", profile_wait=100, profile_active=3, profile_memory=False, log_every=1000,
             profile_record_shapes=False)
FORCE_CUDNN = ("import sys, torch; import tutorial_lib.engine as e; "
               "e.set_cudnn_benchmark = lambda cfg: setattr(torch.backends.cudnn, 'benchmark', True); "
               "from tutorial_lib.__main__ import main; sys.exit(main(sys.argv[1:]))")
DP_LABELS = (("dp scatter", "scatter"), ("dp replicate", "replicate"), ("dp parallel forward", "forward"),
             ("dp gather", "gather"), ("ReduceAddCoalesced", "gradient reduce to GPU 0"), ("backward", "backward"),
             ("optimizer", "optimizer"), ("forward", "loss + DataParallel bookkeeping"),
             ("h2d copy", "input"), ("data wait", "input"))


class Monitor:
    """nvidia-smi sampling every 200 ms while a case runs: per-GPU utilisation and memory used."""

    def __init__(self, path: Path):
        self.path, self.proc = path, None
        if shutil.which("nvidia-smi") and not CPU:
            self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used",
                                          "--format=csv,noheader,nounits", "-lms", "200"],
                                         stdout=open(path, "w"), stderr=subprocess.DEVNULL)

    def stop(self) -> dict:
        if self.proc is None:
            return {}
        self.proc.terminate()
        self.proc.wait()
        rows = [line.split(",") for line in self.path.read_text().splitlines() if line.count(",") == 2]
        per = {}
        for i, util, mem in rows:
            per.setdefault(int(i), []).append((float(util), float(mem)))
        busy = {i: [u for u, _ in v if u > 0] for i, v in per.items()}
        return {"util_pct": [round(sum(busy[i]) / len(busy[i]), 1) if busy[i] else 0.0 for i in sorted(per)],
                "mem_used_mb": [max(m for _, m in per[i]) for i in sorted(per)]}


def monitored(cases: Cases, name: str, gpus: int, overrides: dict, estimate: float, **kw) -> dict | None:
    mon = Monitor(Path(f"runs/gpu/dp_vs_ddp/{name}.smi.csv"))
    rec = cases.run(name, gpus, overrides, estimate, **kw)
    seen = mon.stop()
    if rec is not None and seen:
        n = rec["gpus"]
        rec.update(util_pct=seen["util_pct"][:n], mem_used_mb=seen["mem_used_mb"][:n])
    return rec


def dp_parts(run_dir: str) -> dict:
    """DataParallel's step, cut into the parts its one thread spends time on (the engine labels scatter,
    replicate, the replicas' forward and gather), from the profiled steps; and each GPU's busy share."""
    files = trace_summary.find_traces(run_dir)
    events = trace_summary.read_trace(next(iter(files.values()))[-1])["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    steps = sorted((e for e in spans if str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"])
    main = (steps[0]["pid"], steps[0]["tid"])
    by_label: dict[str, list] = {}
    for e in spans:
        for label, part in DP_LABELS:
            if e["name"] == label and ((e["pid"], e["tid"]) == main or label == "ReduceAddCoalesced"):
                by_label.setdefault(part, []).append((e["ts"], e["ts"] + e["dur"]))
    ordered = [(part, intervals.union(by_label.get(part, []))) for _, part in DP_LABELS]
    kernels: dict[str, list] = {}
    for e in spans:
        if e.get("cat") == "kernel":
            kernels.setdefault(str(e.get("args", {}).get("device", e["pid"])), []).append((e["ts"], e["ts"] + e["dur"]))
    parts: dict[str, float] = {}
    busy = {d: 0.0 for d in kernels}
    total = 0.0
    for s in steps:
        window = (s["ts"], s["ts"] + s["dur"])
        total += s["dur"]
        taken: list = []
        for part, merged in ordered:
            new = intervals.subtract(intervals.clip(merged, *window), taken)
            parts[part] = parts.get(part, 0.0) + intervals.length(new)
            taken = intervals.union(taken + new)
        parts["other (Python, logging)"] = parts.get("other (Python, logging)", 0.0) + intervals.length(
            intervals.subtract([window], taken))
        for d, iv in kernels.items():
            busy[d] += intervals.length(intervals.clip(intervals.union(iv), *window))
    n = len(steps)
    return {"parts_ms": {k: round(v / n / 1000, 3) for k, v in parts.items()},
            "profiled_step_ms": round(total / n / 1000, 3),
            "gpu_busy_pct": {f"GPU {d}": round(100 * v / total, 1) for d, v in sorted(busy.items())}}


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    budget = float(os.environ.get("BUDGET", 1500 if CPU else 430))
    cases = Cases("dp_vs_ddp", budget, OUT / "dp_vs_ddp.log")
    n4, n2 = (2, 2) if CPU else (4, 2)
    # a node of 2 GPUs (or KNOBS_ONLY=1): the 1-GPU baselines at batch 256, then the 2-GPU cases one at a time
    two = not CPU and (os.environ.get("KNOBS_ONLY") == "1" or torch.cuda.device_count() < 4)
    singles = [("1gpu_eager", 1, {}), ("1gpu_fast", 1, FAST),
               ("1gpu_fast_b1024", 1, dict(FAST, batch_size=1024, steps=120, timing_warmup=40)),
               ("1gpu_eager_b1024", 1, dict(batch_size=1024, steps=120, timing_warmup=40))]
    print(f"== 1 GPU, {2 if two else 4} cases at once (one per GPU); budget {budget:.0f} s", flush=True)
    cases.run_together(singles[:2] if two else singles, estimate_s=50)
    if two:
        print("== 2 GPUs only: DataParallel, DDP and DDP's knobs one case at a time (the 4-GPU cases need 4 GPUs)")
        for name, gpus, overrides in [c for pair in two_gpu_rounds(n2) for c in pair]:
            if name == "dp_2gpu":  # traced here: its step decomposed, as dp_4gpu's is on 4 GPUs
                monitored(cases, name, gpus, dict(overrides, **TRACE), 50)
            else:
                cases.run(name, gpus, overrides, 45)
        return report(cases)
    print(f"== DataParallel and DDP on {n4} GPUs, batch {B} per GPU (DataParallel: batch {B} x GPUs in its one process)")
    plan = [  # (name, overrides, seconds it may take, monitored); the engine's defaults unless named
        ("ddp_fast_4gpu", {**DDP, **FAST, **TRACE, "profile_ranks": "0"}, 50, True),
        ("ddp_fast_4gpu_b1024", dict(DDP, **FAST, batch_size=1024, steps=120, timing_warmup=40), 50, False),
        ("dp_4gpu", dict(dp(n4), **TRACE), 40, True),
        ("dp_4gpu_parts", dict(dp(n4), time_parts=True), 40, False),
        ("ddp_eager_4gpu", dict(DDP, **TRACE), 30, True),
        ("ddp_before_4gpu", dict(DDP, **FAST, **TRACE, ddp_sync="hooks", ddp_compile="split"), 50, False),
        ("dp_4gpu_plain", dp(n4), 30, False),  # neither traced nor timed in parts: the trap's baseline
        # cuDNN re-times its algorithms every step here (about 1.5 s per step on 4x H200): 150 steps took > 240 s
        ("dp_4gpu_cudnn_benchmark", dict(dp(n4), steps=40, timing_warmup=10), 90, False),
    ]
    only = {c for c in os.environ.get("ONLY", "").split(",") if c}  # ONLY=case,case: those (and the 1-GPU ones)
    unknown = only - {name for name, *_ in plan} - {c[0] for pair in two_gpu_rounds(n2) for c in pair}
    if unknown:
        raise SystemExit(f"ONLY={','.join(sorted(unknown))}: no such case; the cases are those of the plan and "
                         "two_gpu_rounds in scripts/gpu/dp_vs_ddp.py")
    for name, overrides, estimate, watch in [c for c in plan if not only or c[0] in only]:
        kw = {"runner": ["-c", FORCE_CUDNN]} if name == "dp_4gpu_cudnn_benchmark" else {}
        if watch:
            monitored(cases, name, n4, overrides, estimate, **kw)
        else:
            cases.run(name, n4, overrides, estimate, **kw)
    print("== on 2 GPUs, two cases at once (GPUs 0-1 and 2-3): DataParallel, DDP, and DDP's knobs (eager)")
    rounds = [[c for c in pair if not only or c[0] in only] for pair in two_gpu_rounds(n2)]
    for pair in [p for p in rounds if p]:
        if CPU:  # SyncBatchNorm has no CPU kernel
            for name, gpus, overrides in [c for c in pair if c[2].get("sync_batchnorm")]:
                cases.records.append({"case": name, "gpus": gpus, "overrides": overrides,
                                      "status": "skipped: SyncBatchNorm has no CPU kernel"})
            pair = [c for c in pair if not c[2].get("sync_batchnorm")]
        watch = Monitor(Path(f"runs/gpu/dp_vs_ddp/{pair[0][0]}.smi.csv")) if pair[0][0] == "dp_2gpu" else None
        cases.run_together(pair, estimate_s=45, monitor=watch)
    return report(cases)


def two_gpu_rounds(n2: int) -> list:
    """DataParallel, DDP and DDP's knobs (eager) on 2 GPUs, in pairs that can run at once on a 4-GPU node."""
    return [[("dp_2gpu", n2, dp(n2)),
             ("ddp_eager_2gpu", n2, dict(DDP))],
            [("dp_2gpu_parts", n2, dict(dp(n2), time_parts=True)),
             ("ddp_eager_2gpu_parts", n2, dict(DDP, time_parts=True))],
            [("ddp_fast_2gpu", n2, dict(DDP, **FAST)), ("knob_grad_accum_steps=4", n2, dict(DDP, grad_accum_steps=4))],
            [("knob_sync_batchnorm=true", n2, dict(DDP, sync_batchnorm=True)),
             ("knob_bucket_cap_mb=1", n2, dict(DDP, ddp_bucket_cap_mb=1))],
            [("knob_bucket_cap_mb=100", n2, dict(DDP, ddp_bucket_cap_mb=100)),
             ("knob_broadcast_buffers=false", n2, dict(DDP, ddp_broadcast_buffers=False))],
            [("knob_gradient_as_bucket_view=false", n2, dict(DDP, ddp_gradient_as_bucket_view=False)),
             ("knob_static_graph=true", n2, dict(DDP, ddp_static_graph=True))]]


def report(cases: Cases) -> int:
    singles = best_singles(cases.records)
    device = next((r["device"] for r in cases.records if "device" in r), "?")
    text = table(cases.records, singles, device)
    traces = summarize_traces([f"runs/gpu/dp_vs_ddp/{c}" for c in ("ddp_eager_4gpu", "ddp_before_4gpu", "ddp_fast_4gpu")],
                              OUT / "traces.txt")
    figures: dict = {"device": device, "batch_per_gpu": B, "best_single_img_s": {str(k): v for k, v in singles.items()}}
    for r in cases.records:
        if "img_s" not in r:
            continue
        b = r["overrides"].get("batch_size", B)
        per_gpu = b // r["gpus"] if r["overrides"].get("parallel") == "dp" else b
        figures[f"{r['case']}_img_s"] = round(r["img_s"], 1)
        figures[f"{r['case']}_step_ms"] = round(r["step_ms"]["median"], 3)
        eff = efficiency(r, singles.get(per_gpu))
        if r["gpus"] > 1 and eff is not None:
            figures[f"{r['case']}_efficiency"] = round(eff, 3)
        for key in ("util_pct", "mem_used_mb"):
            if key in r:
                figures[f"{r['case']}_{key}"] = r[key]
        if r.get("host_parts_ms"):  # time_parts=true: the step cut on the host clock, no profiler
            parts = dict(r["host_parts_ms"])
            figures[f"{r['case']}_host_parts_ms"] = parts
            named = sum(v for k, v in parts.items() if k != "step")
            figures[f"{r['case']}_host_parts_sum_over_measured"] = round(named / r["step_ms"]["median"], 3)
        if r.get("peak_memory_mb"):
            figures[f"{r['case']}_peak_allocated_mb"] = round(r["peak_memory_mb"], 1)
    if "dp_4gpu_plain_img_s" in figures and "dp_4gpu_cudnn_benchmark_img_s" in figures:  # the trap, as a factor
        figures["cudnn_benchmark_slowdown"] = round(figures["dp_4gpu_plain_img_s"]
                                                    / figures["dp_4gpu_cudnn_benchmark_img_s"], 2)
    for dp_case in ("dp_4gpu", "dp_2gpu"):
        if not cases.get(dp_case).get("overrides", {}).get("profile"):
            continue
        try:
            dp = dp_parts(f"runs/gpu/dp_vs_ddp/{dp_case}")
            figures.update({f"{dp_case}_{k}": v for k, v in dp.items()})
            measured = figures.get(f"{dp_case}_step_ms")
            if measured:
                figures[f"{dp_case}_parts_sum_over_measured"] = round(sum(dp["parts_ms"].values()) / measured, 3)
        except Exception as e:  # no trace (skipped or failed case): the table still stands
            print(f"DataParallel trace of {dp_case}: no decomposition ({type(e).__name__}: {e})")
    for t in traces:
        key = f"{t['run'].split('/')[-1]}_{t['worker']}"
        figures[f"{key}_allreduce_calls_per_step"] = round(t["allreduce_calls_per_step"], 2)
        figures[f"{key}_nccl_kernels_per_step"] = round(t["nccl_calls_per_step"], 2)
        figures[f"{key}_host_ops_per_step"] = round(t["host_ops_per_step"], 1)
        figures[f"{key}_nccl_ms_per_step"] = round(t["nccl_ms_per_step"], 3)
        figures[f"{key}_comm_exposed_ms"] = round(t["parts_ms"]["comm"], 3)
        figures[f"{key}_step_parts_ms"] = {k: round(v, 3) for k, v in t["parts_ms"].items()}
    print("\n" + text)
    print("\nDataParallel's step, from its trace (ms per step):",
          json.dumps({k: v for k, v in figures.items() if k.startswith("dp_") and "parts" in k or "busy" in k},
                     indent=1))
    (OUT / "dp_vs_ddp.txt").write_text(text + "\n")
    (OUT / "dp_vs_ddp.json").write_text(json.dumps({"cases": cases.records, "traces": traces}, indent=1,
                                                    default=str) + "\n")
    if CPU:  # a test of the script: the figures go to $OUT only, never into the notebook's reference folder
        reference.write("05_dp_vs_ddp", figures, script="scripts/gpu/dp_vs_ddp.sh (CPU test mode)", card="CPU",
                        gpus=0, torch_version="cpu-test", folder=OUT)
    else:
        path = reference.write(os.environ.get("REF", "05_dp_vs_ddp"), figures, script="scripts/gpu/dp_vs_ddp.sh")
        shutil.copy(path, OUT / path.name)
        print(f"wrote {path}")
    print(f"wrote {', '.join(sorted(p.name for p in OUT.iterdir()))} to {OUT}")
    return 0 if any("img_s" in r for r in cases.records) else 1


if __name__ == "__main__":
    sys.exit(main())
