"""The driver of scripts/gpu/ddp_probe.sh (read its header): DDP at batch 256 per GPU with torch.compile,
case by case, against the best single-GPU run; per-rank traces of today's engine and of compiling before
wrapping; a table, JSON and trace summaries in $OUT."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ddp_cases import CPU, OUT, Cases, best_singles, efficiency, pack_traces, summarize_traces, table  # noqa: E402

from tutorial_lib import reference  # noqa: E402

RO = dict(compile=True, compile_mode="reduce-overhead")
GRAPH = dict(compile=True, cuda_graph=True)  # the whole step as one CUDA graph, compile_mode=default inside it
BUCKETS = dict(ddp_sync="buckets")  # the graph's own buckets, all-reduced during the backward pass
B1024 = dict(batch_size=1024, steps=120, timing_warmup=40)
DDP = dict(parallel="ddp")
TRACE_ALL = dict(profile=True, profile_ranks="all", profile_wait=150, profile_active=3, profile_memory=False,
                 profile_record_shapes=False)
TRACE_RANK0 = {**TRACE_ALL, "profile_ranks": "0"}
TRACE_B1024 = dict(profile_wait=100)  # B1024 runs 120 steps: the profiled ones come after the timed window


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    budget = float(os.environ.get("PROBE_BUDGET", 1200 if CPU else 330))
    cases = Cases("ddp_probe", budget, OUT / "ddp_probe.log")
    n = 2 if CPU else min(4, torch.cuda.device_count())  # a 2-GPU node: the cases named 4 GPUs run on 2
    singles = [("1gpu_graph_b256", 1, GRAPH), ("1gpu_reduce-overhead_b256", 1, RO),
               ("1gpu_graph_b1024", 1, dict(GRAPH, **B1024)), ("1gpu_reduce-overhead_b1024", 1, dict(RO, **B1024))]
    print(f"== 1 GPU, {min(n, 4)} cases at once (one per GPU); budget {budget:.0f} s", flush=True)
    cases.run_together(singles[:n] if not CPU else singles, estimate_s=60)
    print(f"== DDP on {n} GPUs, batch 256 per GPU unless named", flush=True)
    ddp = [  # name, GPUs, overrides, seconds it may take (compilation included)
        ("ddp_graph", n, dict(DDP, **GRAPH), 55),
        ("ddp_graph_buckets", n, dict(DDP, **GRAPH, **BUCKETS), 60),
        ("ddp_graph_buckets_b1024", n, dict(DDP, **GRAPH, **BUCKETS, **B1024), 60),
        ("ddp_graph_buckets_bf16grads", n, dict(DDP, **GRAPH, **BUCKETS, ddp_grad_dtype="bf16"), 60),
        ("ddp_graph_buckets_traced", n, dict(DDP, **GRAPH, **BUCKETS, **TRACE_RANK0), 65),
        ("ddp_graph_buckets_b1024_bf16grads", n, dict(DDP, **GRAPH, **BUCKETS, **B1024, ddp_grad_dtype="bf16"), 60),
        ("ddp_graph_buckets_eager", n, dict(DDP, cuda_graph=True, **BUCKETS), 40),
        ("ddp_graph_eager", n, dict(DDP, cuda_graph=True), 40),
        ("ddp_graph_buckets_cap8", n, dict(DDP, **GRAPH, **BUCKETS, ddp_bucket_cap_mb=8), 60),
        ("ddp_graph_buckets_2gpu", 2, dict(DDP, **GRAPH, **BUCKETS), 55),
        ("ddp_graph_b1024", n, dict(DDP, **GRAPH, **B1024), 55),
        ("ddp_graph_no_buffer_broadcast", n, dict(DDP, **GRAPH, ddp_broadcast_buffers=False), 55),
        ("ddp_graph_bf16grads", n, dict(DDP, **GRAPH, ddp_grad_dtype="bf16"), 55),
        ("ddp_graph_b1024_bf16grads", n, dict(DDP, **GRAPH, **B1024, ddp_grad_dtype="bf16"), 55),
        ("ddp_graph_2gpu", 2, dict(DDP, **GRAPH), 50),
        ("ddp_ro_flat", n, dict(DDP, **RO, ddp_sync="flat"), 55),
        ("ddp_graph_traced", n, dict(DDP, **GRAPH, **TRACE_RANK0), 60),
        ("ddp_ro_split", n, dict(DDP, **RO, ddp_sync="hooks", ddp_compile="split", **TRACE_ALL), 75),
        ("ddp_ro_whole", n, dict(DDP, **RO, ddp_sync="hooks", ddp_compile="whole"), 60),
        ("ddp_eager", n, dict(DDP), 25),
        ("ddp_graph_2gpu_b1024", 2, dict(DDP, **GRAPH, **B1024), 55),
        ("ddp_ro_inner", n, dict(DDP, **RO, ddp_sync="hooks", ddp_compile="inner"), 55),
        # the gap at batch 256: the same graphed step traced on 1 GPU and on every rank of n (classes of kernels)
        ("1gpu_graph_traced", 1, dict(GRAPH, **TRACE_RANK0), 50),
        ("ddp_graph_traced_all", n, dict(DDP, **GRAPH, **TRACE_ALL), 60),
        # NCCL's protocol for the 45 MB flat all-reduce inside the graph (its tuner picked LL on 4x H200)
        ("ddp_graph_nccl_simple", n, dict(DDP, **GRAPH), 55, {"NCCL_PROTO": "Simple"}),
        ("ddp_graph_nccl_ll128", n, dict(DDP, **GRAPH), 55, {"NCCL_PROTO": "LL128"}),
        # the gap at batch 1024, the same way
        ("1gpu_graph_b1024_traced", 1, {**GRAPH, **B1024, **TRACE_RANK0, **TRACE_B1024}, 55),
        ("ddp_graph_b1024_traced_all", n, {**DDP, **GRAPH, **B1024, **TRACE_ALL, **TRACE_B1024}, 65),
    ]
    only = [c for c in os.environ.get("PROBE_CASES", "").split(",") if c]  # a subset, by name (singles always run)
    unknown = set(only) - {c[0] for c in ddp}
    if unknown:
        raise SystemExit(f"PROBE_CASES names no case {sorted(unknown)}; the cases: {', '.join(c[0] for c in ddp)}")
    for name, gpus, overrides, estimate, *env in ddp:  # env: extra environment variables of the case
        if not only or name in only:
            cases.run(name, gpus, overrides, estimate, extra_env=env[0] if env else None)

    singles = best_singles(cases.records)
    device = next((r["device"] for r in cases.records if "device" in r), "?")
    text = table(cases.records, singles, device)
    print("\n" + text, flush=True)
    traced = [f"runs/gpu/ddp_probe/{c}" for c in ("ddp_graph_traced", "ddp_graph_buckets_traced", "ddp_ro_split",
                                                    "ddp_graph_traced_all", "ddp_graph_b1024_traced_all")
              if cases.get(c).get("status") == "ok"]
    traces = summarize_traces(traced, OUT / "traces.txt")
    pack_traces(traced, OUT / "traces.tar.gz")
    print("\nper-rank traces (ms per profiled step; NCCL kernels per step; NCCL time hidden under compute):")
    for t in traces:
        print(f"  {t['run'].split('/')[-1]:14s} {t['worker']:6s} step {t['step_ms']:.2f} ms  "
              + "  ".join(f"{k} {v:.2f}" for k, v in t["parts_ms"].items())
              + f"  | all_reduce calls {t['allreduce_calls_per_step']:g}, NCCL kernels {t['nccl_calls_per_step']:g} "
                f"{t['nccl_ms_per_step']:.2f} ms, "
                f"hidden {t['nccl_hidden_ms_per_step']:.2f} ms")
    hints = {r["case"]: r["hints"] for r in cases.records if r.get("hints")}
    if hints:
        print("\ncompiler remarks (TORCH_LOGS=perf_hints,recompiles,graph_breaks), first lines per case:")
        for case, lines in hints.items():
            print(f"  {case}: " + "\n    ".join(lines[:4]))
    (OUT / "ddp_probe.txt").write_text(text + "\n")
    (OUT / "ddp_probe.json").write_text(json.dumps(
        {"cpu_mode": CPU, "device": device, "best_single_img_s": singles, "cases": cases.records,
         "traces": traces}, indent=1, default=str) + "\n")
    figures = {"device": device}
    for r in cases.records:
        if "img_s" in r:
            figures[f"{r['case']}_img_s"] = round(r["img_s"], 1)
            eff = efficiency(r, singles.get(r["overrides"].get("batch_size", 256)))
            if r["gpus"] > 1 and eff is not None:
                figures[f"{r['case']}_efficiency"] = round(eff, 3)
    figures.update(trace_figures(traces))
    for key, one, many in (("gap_traces", "1gpu_graph_traced", "ddp_graph_traced_all"),
                           ("gap_traces_b1024", "1gpu_graph_b1024_traced", "ddp_graph_b1024_traced_all")):
        if all(cases.get(c).get("status") == "ok" for c in (one, many)):
            figures[key] = gap(f"runs/gpu/ddp_probe/{one}", f"runs/gpu/ddp_probe/{many}")
            print(f"\n{key}: the same graphed step traced on 1 GPU and on every DDP rank (ms per step):")
            print(json.dumps(figures[key], indent=1))
    # notebook 05 shows these (copy $OUT/05_ddp_probe.json to notebooks/reference/)
    reference.write(os.environ.get("PROBE_REF", "05_ddp_probe"), figures, script="scripts/gpu/ddp_probe.sh" + (" (CPU test mode)" if CPU else ""),
                    folder=OUT, **(dict(card="CPU", gpus=0, torch_version="cpu-test") if CPU else {}))
    print(f"\nwrote {', '.join(sorted(p.name for p in OUT.iterdir()))} to {OUT}")
    return 0 if any("img_s" in r for r in cases.records) else 1


def gap(*run_dirs: str) -> dict:
    """Where a DDP step's extra time goes: for each rank of each run, the GPU step, its parts and its kernels in
    tl.roofline's classes (ms per profiled step), so a 1-GPU trace and the DDP ranks' can be set side by side."""
    from tutorial_lib import roofline, trace_summary

    out = {}
    for d in run_dirs:
        for t in trace_summary.summarize(d, top=100_000):  # every kernel: the classes need them all
            out[f"{Path(d).name}_{t.worker}"] = {
                "step_ms": round(t.step_ms, 3), "parts_ms": {k: round(v, 3) for k, v in t.parts_ms.items()},
                "classes_ms": {k: round(v, 3) for k, v in roofline.kernel_classes(t.top_kernels).items()},
                "kernels_per_step": round(sum(k["calls"] for k in t.top_kernels), 1)}
    return out


def trace_figures(traces: list[dict]) -> dict:
    """Per traced rank: the step's parts in ms and the NCCL time per step (exposed and hidden), for notebook 05."""
    out = {}
    for t in traces:
        key = f"{t['run'].split('/')[-1]}_{t['worker']}"
        out[f"{key}_parts_ms"] = {k: round(v, 3) for k, v in t["parts_ms"].items()}
        out[f"{key}_nccl_ms_per_step"] = round(t["nccl_ms_per_step"], 3)
        out[f"{key}_nccl_hidden_ms_per_step"] = round(t["nccl_hidden_ms_per_step"], 3)
    return out


if __name__ == "__main__":
    sys.exit(main())
