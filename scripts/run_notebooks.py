#!/usr/bin/env python3
"""Execute notebooks headless, each in a fresh kernel of this Python, from the notebooks/ folder.

    python scripts/run_notebooks.py --out build/notebooks notebooks/*.ipynb   # executed copies (make workbook)
    python scripts/run_notebooks.py --inplace notebooks/01_single_gpu.ipynb     # refresh committed outputs
"""
import argparse
import sys
import time
from pathlib import Path

import nbclient
import nbformat


def run(path: Path, dest: Path, timeout: int) -> float:
    nb = nbformat.read(path, as_version=4)
    t0 = time.time()
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=timeout,
                                     resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
    finally:
        dest.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, dest)
    return time.time() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("notebooks", nargs="+", type=Path)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--out", type=Path, help="folder for executed copies")
    g.add_argument("--inplace", action="store_true", help="overwrite the notebooks with their outputs")
    p.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    args = p.parse_args()
    failed = 0
    for nb in args.notebooks:
        dest = nb if args.inplace else args.out / nb.name
        try:
            print(f"{nb}: {run(nb, dest, args.timeout):.0f} s -> {dest}", flush=True)
        except nbclient.exceptions.CellExecutionError as e:
            failed += 1
            print(f"{nb}: FAILED (executed copy with the error: {dest})\n{str(e)[-2000:]}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
