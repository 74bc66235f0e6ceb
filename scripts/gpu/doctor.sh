#!/usr/bin/env bash
# The workshop pre-flight (python -m tutorial_lib doctor) on a GPU machine, run from the repo root; $OUT
# collects the outputs. Exercises every GPU check: GPUs and MIG slices, the driver against torch's CUDA,
# bf16, and with 2+ GPUs a real NCCL all-reduce (correctness, and the bandwidth of a 64 MiB all-reduce).
# Writes (3 files):
#   $OUT/doctor.json              the --json report (every check, its seconds)
#   $OUT/doctor.txt               the table as an instructor sees it
#   $OUT/reference/doctor.json    the GPU checks' lines as a reference record (tutorial_lib.reference):
#                                 copy it to notebooks/reference/, then python scripts/instructor_figures.py
# Jupyter, Slurm and the lock's exact versions are absent on the lent GPU machines: those lines WARN, SKIP or
# FAIL there, which is expected and not recorded. About 30-60 s (the all-reduce starts 2 CUDA processes).
# CPU=1 runs the same steps on a machine without a GPU (a dry run: the record names no card).
set -uo pipefail
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export OUT=${OUT:-build/gpu}; mkdir -p "$OUT/reference"
PY=$(command -v python3 || command -v python)
[[ ${CPU:-0} == 1 ]] || nvidia-smi -L

start=$SECONDS
timeout 300 "$PY" -m tutorial_lib doctor --json > "$OUT/doctor.json"
echo "doctor exit code $? in $(( SECONDS - start )) s (1: some check FAILs; the table says which)"
[[ -s $OUT/doctor.json ]] || { echo "error: doctor wrote no report (see its error above)"; exit 1; }

"$PY" - <<'PY'
import json, os

from tutorial_lib import doctor, reference

out = os.environ["OUT"]
r = json.load(open(os.path.join(out, "doctor.json")))
report = doctor.Report([doctor.Check(**c) for c in r["checks"]], host=r["host"])
table = report.table()
print(table)
open(os.path.join(out, "doctor.txt"), "w").write(table + "\n")
gpu = {c["name"]: f"{c['status']}: {c['message']}" for c in r["checks"] if c["name"] in ("gpus", "driver", "bf16", "nccl")}
gpu["seconds_all_checks"] = round(sum(c["seconds"] for c in r["checks"]), 1)
dry = os.environ.get("CPU") == "1"
path = reference.write("doctor", gpu, script="scripts/gpu/doctor.sh", folder=os.path.join(out, "reference"),
                       **(dict(card="none (CPU dry run)", gpus=0, torch_version="-") if dry else {}))
print(f"wrote {os.path.relpath(path)}: " + ", ".join(gpu))
PY
