#!/usr/bin/env python3
"""Execute notebooks headless, each in a fresh kernel of this Python, from the notebooks/ folder.

    python scripts/run_notebooks.py --out build/notebooks notebooks/*.ipynb   # executed copies (make workbook)
    python scripts/run_notebooks.py --inplace notebooks/01_single_gpu.ipynb     # refresh committed outputs
    python scripts/run_notebooks.py --out build/notebooks --timings docs/notebook_timings.json notebooks/*.ipynb

--timings records each notebook's run (seconds, its slowest cells, the machine) into a JSON file, merged
with what it holds; scripts/instructor_figures.py turns docs/notebook_timings.json into the instructor's
guide's timing plan. --stored records the run a notebook already holds (its committed CPU run) instead of
executing it:
    python scripts/run_notebooks.py --stored --timings docs/notebook_timings.json notebooks/*.ipynb

--reference is the GPU runner (scripts/gpu/notebooks.sh): every `tl.reference.record(name, ...)` in a cell writes
notebooks/reference/<name>.json (card, torch, date), and after each notebook that ran without an error the
fingerprint of its recording cells is stamped into those files, so tests/test_reference.py can tell when a
notebook changed after its reference run. It needs a CUDA GPU.
"""
import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import re

import nbclient
import nbformat

from tutorial_lib import reference


def run(path: Path, dest: Path, timeout: int, keep_going: bool = False) -> float:
    """Execute one notebook into `dest`; keep_going: run every cell even after one fails (see cell_errors)."""
    nb = nbformat.read(path, as_version=4)
    t0 = time.time()
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=timeout, allow_errors=keep_going,
                                     resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
    finally:
        coalesce_streams(nb)
        dest.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, dest)
    return time.time() - t0


OVERWRITTEN = re.compile(r".*\r(?=[^\n])")  # a line's text up to its last carriage return


def coalesce_streams(nb) -> None:
    """Merge each cell's consecutive stdout (stderr) outputs into one and keep only what a "\\r" left on each
    line: a progress bar writes its state again and again, and a browser shows only the last one."""
    for cell in nb.cells:
        merged = []
        for out in cell.get("outputs", []):
            if (out.get("output_type") == "stream" and merged and merged[-1].get("output_type") == "stream"
                    and merged[-1]["name"] == out["name"]):
                merged[-1]["text"] += out["text"]
            else:
                merged.append(out)
        for out in merged:
            if out.get("output_type") == "stream" and "\r" in out["text"]:
                out["text"] = OVERWRITTEN.sub("", out["text"])
        if "outputs" in cell:
            cell["outputs"] = merged


def cell_errors(dest: Path) -> list[str]:
    """'cell N: Name: value' for every code cell of an executed notebook whose outputs hold an error."""
    nb = nbformat.read(dest, as_version=4)
    return [f"cell {i}: {out.get('ename')}: {str(out.get('evalue'))[:300]}"
            for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
            for out in cell.get("outputs", []) if out.get("output_type") == "error"]


def cell_seconds(nb) -> list[tuple[int, float, str]]:
    """(cell index, seconds, first line) of each executed code cell, from the timing nbclient records."""
    out = []
    for i, cell in enumerate(nb.cells):
        t = cell.get("metadata", {}).get("execution", {})
        if cell.cell_type == "code" and "iopub.execute_input" in t and "shell.execute_reply" in t:
            start, end = (datetime.datetime.fromisoformat(t[k].replace("Z", "+00:00"))
                          for k in ("iopub.execute_input", "shell.execute_reply"))
            lines = [x for x in cell.source.splitlines() if x.strip() and not x.startswith("# NBVAL")]
            out.append((i, round((end - start).total_seconds(), 1), lines[0][:80] if lines else ""))
    return out


def machine() -> str:
    """The device the notebooks ran on, in words: 'CPU only (2 cores)' or '1x NVIDIA H100 ...'."""
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.device_count()}x {torch.cuda.get_device_name(0)}"
    return f"CPU only ({len(os.sched_getaffinity(0))} cores, {platform.machine()})"


def stored_run(nb) -> tuple[float, str]:
    """(seconds, date) of the run a notebook holds: from its first cell's start to its last cell's end."""
    times = [cell.metadata.execution for cell in nb.cells if "execution" in cell.get("metadata", {})]
    if not times or "iopub.execute_input" not in times[0] or "shell.execute_reply" not in times[-1]:
        raise SystemExit("the notebook holds no timed run (execute it with this script first)")
    start, end = (datetime.datetime.fromisoformat(t.replace("Z", "+00:00"))
                  for t in (times[0]["iopub.execute_input"], times[-1]["shell.execute_reply"]))
    return (end - start).total_seconds(), end.date().isoformat()


def record_timing(path: Path, dest: Path, seconds: float | None = None, load: float | None = None) -> None:
    """Merge a notebook's run into the JSON file at `path` (load: the 1-minute load average during it).
    seconds=None: the run the notebook holds (its machine and load are not recorded in it)."""
    nb = nbformat.read(dest, as_version=4)
    cells = cell_seconds(nb)
    if seconds is None:
        seconds, date = stored_run(nb)
        where, torch_version = "the committed CPU run", None
    else:
        import torch

        date, where, torch_version = datetime.date.today().isoformat(), machine(), torch.__version__
    data = json.loads(path.read_text()) if path.is_file() else {"notebooks": {}}
    data["notebooks"][Path(dest).stem] = {
        "seconds": round(seconds, 1), "machine": where, "load": None if load is None else round(load, 1),
        "torch": torch_version, "date": date, "code_cells": len(cells),
        "slowest": sorted(cells, key=lambda c: -c[1])[:4]}
    data["notebooks"] = dict(sorted(data["notebooks"].items()))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


def start_recording() -> None:
    """--reference: the kernels this process starts record into notebooks/reference/ (tutorial_lib.reference)."""
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("--reference records GPU figures, but no CUDA GPU is visible here (torch "
                         f"{torch.__version__}): run it on a GPU node")
    print(f"recording into {reference.FOLDER}: torch {torch.__version__} | {torch.cuda.device_count()} x "
          f"{torch.cuda.get_device_name(0)}", flush=True)
    os.environ[reference.ENV] = str(reference.FOLDER)
    os.environ["WORKBOOK_REFERENCE_SCRIPT"] = "scripts/gpu/notebooks.sh"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("notebooks", nargs="+", type=Path)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--out", type=Path, help="folder for executed copies")
    g.add_argument("--inplace", action="store_true", help="overwrite the notebooks with their outputs")
    g.add_argument("--stored", action="store_true", help="execute nothing: record the runs the notebooks hold")
    p.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    p.add_argument("--timings", type=Path, help="JSON file to record each notebook's run time and slowest cells")
    p.add_argument("--keep-going", action="store_true",
                   help="run every cell even after one fails, then list the failed cells (one pass finds them all)")
    p.add_argument("--reference", action="store_true", help="record the cells' GPU figures into notebooks/reference/ "
                   "and stamp each notebook's recording cells there (a CUDA GPU)")
    args = p.parse_args()
    if args.reference:
        start_recording()
    if args.stored:
        if not args.timings:
            p.error("--stored records timings: give --timings FILE")
        for nb in args.notebooks:
            record_timing(args.timings, nb)
        return 0
    failed = 0
    for nb in args.notebooks:
        dest = nb if args.inplace else args.out / nb.name
        try:
            load = os.getloadavg()[0]
            seconds = run(nb, dest, args.timeout, args.keep_going)
            errors = cell_errors(dest) if args.keep_going else []
            if errors:
                failed += 1
                print(f"{nb}: {len(errors)} cell(s) FAILED ({dest}):\n  " + "\n  ".join(errors), file=sys.stderr)
                continue
            print(f"{nb}: {seconds:.0f} s -> {dest}", flush=True)
            if args.reference:
                print(f"{nb}: stamped {', '.join(reference.stamp(nb)) or 'nothing (no cell records)'}", flush=True)
            if args.timings:  # other work on the machine slows the run: keep the load beside the time
                record_timing(args.timings, dest, seconds, (load + os.getloadavg()[0]) / 2)
        except (nbclient.exceptions.CellExecutionError, nbclient.exceptions.CellTimeoutError,
                nbclient.exceptions.DeadKernelError) as e:
            failed += 1
            print(f"{nb}: FAILED (executed copy with the error: {dest})\n{str(e)[-2000:]}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
