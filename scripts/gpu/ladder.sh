#!/usr/bin/env bash
# Notebook 04 on one GPU: the optimization ladder, every rung measured in one process on one card, with the
# evidence for why the last rungs work (run from the top of the workbook; $OUT collects the outputs).
#
#     OUT=/path/for/results bash scripts/gpu/ladder.sh           # one GPU: about 6-8 minutes on an H100/H200
#     OUT=/tmp/ladder bash scripts/gpu/ladder.sh --small         # the CPU check: every step with tiny sizes
#
# 1. `python -m tutorial_lib ladder --trace --reference`: fp32 -> TF32 -> bf16 -> channels_last -> fused AdamW ->
#    compile -> reduce-overhead -> batch 1024 -> gpu_resident, fp16 + GradScaler beside it, the last rung at
#    batch 256, the bare-loop ceiling; then profiled runs of the bf16 eager step and of the last rung (at
#    batch 1024 and 256), summarised offline (tutorial_lib.trace_summary). Rungs that would start after 5.5 minutes are skipped,
#    and step 2 when the ladder took more than 7.5 minutes, so that the whole script ends within 10.
# 2. Notebook 03's bench (IO / SYNTHETIC / FULL) at configs/optimized.yaml, with the DataLoader and GPU-resident.
# 3. docs/performance.md rendered from the reference files.
# Writes notebooks/reference/04_ladder.json and 04_ladder_<card>.json (commit both), and into $OUT (6 files):
# ladder.md, ladder.json, bench_optimized.json, performance.md, reference.tgz (notebooks/reference/04_ladder*),
# summary.txt (the tables and the targets). --small writes the same files except the reference ones.
set -euo pipefail
: "${OUT:?set OUT to the folder for the results}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" KINETO_LOG_LEVEL=99 PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
mkdir -p "$OUT"
small=${1:-}
if [[ -n $small && $small != --small ]]; then echo "usage: OUT=dir bash $0 [--small]" >&2; exit 2; fi
if [[ -z $small ]]; then
    $PY -c 'import torch; assert torch.cuda.is_available(), "no CUDA GPU visible: run this on a GPU machine, or with --small"'
    nvidia-smi -L | head -1
fi
$PY -c 'import torch; print("torch", torch.__version__)'
start=$SECONDS

echo "== 1. the ladder"
if [[ -n $small ]]; then
    $PY -m tutorial_lib ladder --small --out "$OUT" | grep -v '^|'
else
    $PY -m tutorial_lib ladder --trace --reference --out "$OUT" | grep -v '^|'
fi
echo "[$((SECONDS - start)) s]"

echo "== 2. notebook 03's bench at configs/optimized.yaml"
if (( SECONDS - start > 450 )); then  # a call on the lent machines may run 10 minutes: keep the rest within it
    echo "skipped: $((SECONDS - start)) s spent on the ladder already"; echo '{}' >"$OUT/bench_optimized.json"
else
$PY - "$OUT" "$small" <<'PY'
import json, os, sys
from tutorial_lib import bench, config, reference

out, small = sys.argv[1], bool(sys.argv[2])
cfg = config.load("configs/optimized.yaml").replace(progress=False, tensorboard=False,
                                                    num_workers=config.default_workers())  # for loader=dataloader
if small:  # tiny sizes; the CPU compiles for minutes, so the check runs eagerly
    cfg = cfg.replace(model="resnet18_imagenet", batch_size=16, train_size=256, compile=False, device="cpu")
steps, window = (4, 2) if small else (200, 20)
figures = {}
for loader in ("dataloader", "gpu_resident"):
    r = bench.bench(cfg.replace(loader=loader, out_dir=f"runs/04_bench/{loader}"), steps=steps, window=window)
    print(f"-- loader={loader}\n{r.summary()}", flush=True)
    figures[loader] = {"device": r.device, **{m: f.img_s for m, f in r.figures.items()},
                       "full_over_synthetic": r.img_s("full") / r.img_s("synthetic"), "verdict": r.verdict}
json.dump(figures, open(os.path.join(out, "bench_optimized.json"), "w"), indent=1)
if not small:  # add to the two reference files this run's ladder wrote, never to another card's
    import torch
    from tutorial_lib import ladder
    for name in ladder.reference_names("04_ladder", torch.cuda.get_device_name(0)):
        rec = reference.load(name)
        rec["figures"]["bench_optimized"] = figures
        reference.write(name, rec["figures"], script=rec["script"])
PY
fi
echo "[$((SECONDS - start)) s]"

echo "== 3. docs/performance.md and the summary"
$PY - "$OUT" "$small" <<'PY'
import json, os, sys
from tutorial_lib import ladder

out, small = sys.argv[1], bool(sys.argv[2])
rows = json.load(open(os.path.join(out, "ladder.json")))["rows"]
lines = [ladder.markdown(rows), "", "targets: " + json.dumps(ladder.headline(rows))]
if not small:
    import shutil, subprocess
    subprocess.run([sys.executable, "scripts/performance_doc.py"], check=True)
    shutil.copy("docs/performance.md", os.path.join(out, "performance.md"))
else:
    rec = {"card": "CPU (check run)", "gpus": 0, "torch": "-", "date": "-", "script": "scripts/gpu/ladder.sh --small",
           "figures": {**ladder.reference_figures(rows, {}), "bench_optimized": json.load(open(os.path.join(out, "bench_optimized.json")))}}
    open(os.path.join(out, "performance.md"), "w").write(ladder.performance_doc([rec]))
open(os.path.join(out, "summary.txt"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
if [[ -z $small ]]; then tar czf "$OUT/reference.tgz" notebooks/reference/04_ladder*.json docs/performance.md; fi
echo "done in $((SECONDS - start)) s"
