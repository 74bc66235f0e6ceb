#!/usr/bin/env bash
# Profiling on a GPU machine (notebook 02): record the GPU trace fixture of tests/test_profiling.py, profile the
# baseline (fp32) and the bf16 + channels_last run of one GPU, and a 2-GPU DDP run (one trace per rank); print
# their offline summaries and a table at the end.
#
#     OUT=/path/to/results bash scripts/gpu/profiling.sh      # from the top of the workbook, 1-2 GPUs
#
# Writes under $OUT (at most 6 files):
#   fixtures/gpu_resnet18_bf16.pt.trace.json.gz   commit as tests/fixtures/gpu_resnet18_bf16.pt.trace.json.gz
#   figures/baseline_fp32.png, figures/ddp_2gpu.png   summarize(...).plot() of those runs
#   profiling_gpu.json                             the numbers of the final table
#   notebooks/02_profiling.ipynb                   executed, only where nbclient and ipykernel are installed
set -euo pipefail

: "${OUT:?set OUT to the folder for the results}"
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export KINETO_LOG_LEVEL=99 PYTHONUNBUFFERED=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$OUT/fixtures" "$OUT/figures"

gpus=$($PY -c 'import torch; print(torch.cuda.device_count())')
if (( gpus < 1 )); then
    echo "error: no CUDA GPU visible (torch.cuda.device_count() is 0); run this on a GPU machine" >&2
    exit 2
fi
$PY -c 'import torch; print("torch", torch.__version__, "|", torch.cuda.device_count(), "x", torch.cuda.get_device_name(0))'

# train NAME [launcher words...] -- key=value...: one run into $work/NAME, its log in $work/NAME.log
train() {
    local name=$1; shift
    local launcher=()
    while [[ $1 != -- ]]; do launcher+=("$1"); shift; done
    shift
    local t0=$SECONDS
    if ! "${launcher[@]}" -m tutorial_lib train "$@" out_dir="$work/$name" progress=false >"$work/$name.log" 2>&1; then
        echo "error: run $name failed; its log ends with:" >&2
        tail -n 30 "$work/$name.log" >&2
        exit 1
    fi
    echo "$name: $(grep -E 'img/s' "$work/$name.log" | tail -n 1) [$((SECONDS - t0)) s]"
}

common=(dataset=shapes model=resnet18 train_size=16384 eval=false profile=true)

# 1. The fixture: a few steps of resnet18 at batch 32 in bf16; 2 recorded steps, no shapes (a small file).
train fixture "$PY" -- "${common[@]}" precision=bf16 channels_last=true batch_size=32 num_workers=2 steps=7 \
    profile_wait=3 profile_warmup=1 profile_active=2 profile_record_shapes=false
newest_trace() { local files=("$1"/tb/profile/rank0.*.pt.trace.json.gz); echo "${files[-1]}"; }
fixture=$(newest_trace "$work/fixture")
if (( $(stat -c %s "$fixture") > 700000 )); then  # too big for the repository: drop the memory events
    rm -rf "$work/fixture"
    train fixture "$PY" -- "${common[@]}" precision=bf16 channels_last=true batch_size=32 num_workers=2 steps=7 \
        profile_wait=3 profile_warmup=1 profile_active=2 profile_record_shapes=false profile_memory=false
    fixture=$(newest_trace "$work/fixture")
fi
cp "$fixture" "$OUT/fixtures/gpu_resnet18_bf16.pt.trace.json.gz"

# 2. The runs of notebook 02 on one GPU: the fp32 baseline of notebook 01, then bf16 + channels_last.
schedule=(steps=11 profile_wait=5 profile_warmup=2 profile_active=3 batch_size=256 num_workers=8)
train baseline_fp32 "$PY" -- "${common[@]}" "${schedule[@]}"
train bf16_cl "$PY" -- "${common[@]}" "${schedule[@]}" precision=bf16 channels_last=true

# 3. DDP on 2 GPUs: one trace per rank.
if (( gpus >= 2 )); then
    train ddp_2gpu "$PY" -m torch.distributed.run --standalone --nproc_per_node=2 -- "${common[@]}" "${schedule[@]}" \
        parallel=ddp precision=bf16 channels_last=true num_workers=4
else
    echo "ddp_2gpu: skipped, only $gpus GPU visible"
fi

# 4. Summaries, the same checks as tests/test_profiling.py, figures and the final table.
$PY - "$work" "$OUT" <<'EOF'
import json, sys
from pathlib import Path

import matplotlib
matplotlib.use("Agg")
from tutorial_lib import engine
from tutorial_lib.trace_summary import PART_LABELS, PARTS, summarize

work, out = Path(sys.argv[1]), Path(sys.argv[2])
record, failures = {}, []


def check(name, t):
    for s in t.steps:
        if abs(sum(s.parts_ms.values()) - s.step_ms) > 0.01 * s.step_ms:
            failures.append(f"{name} {t.worker} {s.name}: parts {sum(s.parts_ms.values()):.3f} ms != step {s.step_ms:.3f} ms")
    if t.view != "gpu" or not t.top_kernels or t.top_kernels[0]["ms"] <= 0 or t.parts_ms["compute"] <= 0:
        failures.append(f"{name} {t.worker}: no GPU kernel time (view {t.view})")


fixture = out / "fixtures" / "gpu_resnet18_bf16.pt.trace.json.gz"
runs = {"fixture": fixture, "baseline_fp32": work / "baseline_fp32", "bf16_cl": work / "bf16_cl"}
if (work / "ddp_2gpu").exists():
    runs["ddp_2gpu"] = work / "ddp_2gpu"
for name, path in runs.items():
    s = summarize(path)
    print(f"\n================ {name}\n{s}")
    if len(s) > 1:
        print(s.side_by_side())
    for t in s:
        check(name, t)
    host = summarize(path, view="host")
    for t in host:
        if abs(sum(t.parts_ms.values()) - t.step_ms) > 0.01 * t.step_ms:
            failures.append(f"{name} {t.worker}: host view parts do not add up")
    result = engine.load_result(path) if path.is_dir() else None
    record[name] = {
        "device": s[0].device, "ranks": len(s),
        "file_kb": round(sum(t.path.stat().st_size for t in s) / 1024),
        "step_ms": [round(t.step_ms, 3) for t in s],
        "parts_ms": [{p: round(t.parts_ms[p], 3) for p in PARTS} for t in s],
        "host_parts_ms": [{p: round(t.parts_ms[p], 3) for p in PARTS} for t in host],
        "bottleneck": [t.bottleneck for t in s],
        "top_kernels": [k["name"][:100] for k in s[0].top_kernels[:3]],
        "peak_memory_mb_trace": s[0].peak_memory_mb,
        "peak_memory_mb_run": result.peak_memory_mb if result else None,
        "throughput_img_s_run": round(result.throughput_img_s) if result else None,
    }
    if name in ("baseline_fp32", "ddp_2gpu"):
        fig = s.plot()
        fig.savefig(out / "figures" / f"{name}.png", dpi=110)

(out / "profiling_gpu.json").write_text(json.dumps(record, indent=1))
print("\n================ table (ms per profiled step, GPU view; the parts add up to the step)")
cols = ["run", "rank", "step", *PARTS, "largest", "trace KB", "peak MB"]
print(" ".join(f"{c:>9s}" if i else f"{c:14s}" for i, c in enumerate(cols)))
for name, r in record.items():
    for i in range(r["ranks"]):
        peak = next(iter(r["peak_memory_mb_trace"].values()), float("nan")) if i == 0 else float("nan")
        cells = [name, f"rank{i}", f"{r['step_ms'][i]:.2f}", *(f"{r['parts_ms'][i][p]:.2f}" for p in PARTS),
                 r["bottleneck"][i], str(r["file_kb"]), f"{peak:.0f}"]
        print(" ".join(f"{c:>9s}" if j else f"{c:14s}" for j, c in enumerate(cells)))
print(f"device: {record['fixture']['device']}")
print("checks:", "all passed" if not failures else "FAILED\n  " + "\n  ".join(failures))
sys.exit(1 if failures else 0)
EOF

# 5. The notebook, where it can run here (the lent machines have no Jupyter unless a kit is installed).
if $PY -c 'import nbclient, ipykernel, line_profiler' 2>/dev/null; then
    $PY scripts/run_notebooks.py --out "$OUT/notebooks" notebooks/02_profiling.ipynb \
        || echo "notebook 02: FAILED (executed copy in $OUT/notebooks)"
else
    echo "notebook 02: not executed here (needs nbclient, ipykernel and line_profiler)"
fi
echo "fixture: $(stat -c %s "$OUT/fixtures/gpu_resnet18_bf16.pt.trace.json.gz") bytes -> tests/fixtures/gpu_resnet18_bf16.pt.trace.json.gz"
