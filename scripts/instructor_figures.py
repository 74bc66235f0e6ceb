#!/usr/bin/env python3
"""Write the generated tables of docs/instructor.md between its marker comments; --check: fail if stale.

    python scripts/instructor_figures.py           # after new timings or GPU reference files
    python scripts/instructor_figures.py --check   # exit 1 when the guide differs from what its sources give

Sources, never typed by hand:
    docs/notebook_timings.json   each notebook's CPU run (scripts/run_notebooks.py --timings ...)
    docs/notebook_timings_gpu.json   its run at full size on a GPU node (timings.json of scripts/gpu/notebooks.sh)
    notebooks/reference/*.json   what the key cells printed on a GPU (scripts/gpu/*.sh, tutorial_lib.reference)
    notebooks/*.ipynb            the live time each notebook states, and where its collapsed solutions are
"""
import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tutorial_lib import reference  # noqa: E402  (torch-free)

GUIDE = ROOT / "docs" / "instructor.md"
TIMINGS = ROOT / "docs" / "notebook_timings.json"
GPU_TIMINGS = ROOT / "docs" / "notebook_timings_gpu.json"  # the same, from scripts/gpu/notebooks.sh on a GPU node
PLANNED = ("00_setup", "01_single_gpu", "02_profiling", "03_data_loading", "04_mixed_precision", "05_dp_vs_ddp",
           "06_scaling")  # the README's seven; a notebook not written yet gets a row its author fills


def _markdown(name: str) -> list[str]:
    path = ROOT / "notebooks" / f"{name}.ipynb"
    if not path.is_file():
        return []
    return ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "markdown"]


def _gpu_run(run: dict | None) -> str:
    if run is None:
        return "not timed on a GPU node yet"
    slow = ", ".join(f"cell {i} {s:.0f} s" for i, s, _ in run["slowest"][:2])
    return f"{run['seconds']:.0f} s on {run['machine']}, torch {run['torch']}, {run['date']} (slowest: {slow})"


def timings_table() -> str:
    runs = json.loads(TIMINGS.read_text())["notebooks"] if TIMINGS.is_file() else {}
    gpu = json.loads(GPU_TIMINGS.read_text())["notebooks"] if GPU_TIMINGS.is_file() else {}
    rows = ["| notebook | live time (its header) | CPU run, all cells | slowest cells on that CPU run | "
            "GPU node, all cells at full size |", "| --- | --- | --- | --- | --- |"]
    for name in sorted(set(PLANNED) | {p.stem for p in (ROOT / "notebooks").glob("*.ipynb")}):
        stated = next((m.group(1).rstrip(".") for md in _markdown(name)[:1]
                       for m in [re.search(r"\*\*Time:\*\* ([^\n]*)", md)] if m), None)
        run = runs.get(name)
        if run is None:
            note = "not written yet" if not _markdown(name) else "no timed run yet"
            rows.append(f"| {name} | {stated or '-'} | {note}: its author adds the row with "
                        "`scripts/run_notebooks.py --stored --timings docs/notebook_timings.json` | | "
                        f"{_gpu_run(gpu.get(name))} |")
            continue
        slow = "; ".join(f"cell {i} `{text}` {s:.0f} s" for i, s, text in run["slowest"][:3])
        how = (f"{run['machine']} at load {run['load']:g}, torch {run['torch']}" if run["load"] is not None
               else run["machine"])
        rows.append(f"| {name} | {stated or '-'} | {run['seconds']:.0f} s, {how}, {run['date']} | {slow} | "
                    f"{_gpu_run(gpu.get(name))} |")
    return "\n".join(rows)


LONGEST = 160  # characters of a figure shown in the guide's tables


def gpu_figures() -> str:
    files = sorted(reference.FOLDER.glob("*.json"))
    if not files:
        return ("No GPU reference run is recorded yet (`notebooks/reference/` is empty). The GPU scripts in "
                "`scripts/gpu/` write these files on an H100 or H200 node; then run "
                "`python scripts/instructor_figures.py` and the tables appear here.")
    parts = []
    for path in files:
        record = reference.load(path.stem)
        rows = [f"**{path.stem}**: on {reference.where(record)} (`{record['script']}`)", "",
                "| figure | value |", "| --- | --- |"]
        for key, value in record["figures"].items():
            if isinstance(value, float):
                shown = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"  # 59,362 img/s, not 5.936e+04
            else:
                shown = str(value).replace("|", "\\|")
            if len(shown) > LONGEST:  # a table of rows or a curve: the notebook shows it, the file holds it
                shown = f"({type(value).__name__} of {len(value)}: see notebooks/reference/{path.name})"
            rows.append(f"| {key} | {shown} |")
        parts.append("\n".join(rows))
    return "\n\n".join(parts)


def solutions() -> str:
    rows = ["| notebook | collapsed solutions (`<details>`) | questions | their answers |", "| --- | --- | --- | --- |"]
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        text = "\n".join(_markdown(path.stem))
        solved, answers = [], False
        for before, summary in re.findall(r"((?:.*\n){0,40}?)[^\n]*<details><summary>(.*?)</summary>", text):
            exercise = re.findall(r"^\*\*(\d+)\.\*\*", before, re.M)
            answers |= "answer" in summary.lower()
            if "answer" not in summary.lower():
                solved.append(f"exercise {exercise[-1]}" if exercise else summary)
        questions = re.search(r"^## Questions\n(.*?)(?=^## |\Z)", text, re.M | re.S)
        asked = questions.group(1).split("<details>")[0] if questions else ""  # not the answers' numbers
        n_questions = len(re.findall(r"^\d+\. ", asked, re.M))
        rows.append(f"| {path.stem} | {', '.join(solved) or 'none'} | {n_questions} | "
                    f"{'collapsed below them' if answers else 'none written yet' if n_questions else '-'} |")
    return "\n".join(rows)


BLOCKS = {"timings": timings_table, "gpu-figures": gpu_figures, "solutions": solutions}


def render(text: str) -> str:
    for name, make in BLOCKS.items():
        begin, end = f"<!-- {name}:begin (generated by scripts/instructor_figures.py) -->", f"<!-- {name}:end -->"
        if begin not in text or end not in text:
            raise SystemExit(f"{GUIDE}: the markers {begin} ... {end} are missing; put them back")
        head, rest = text.split(begin, 1)
        text = head + begin + "\n" + make() + "\n" + end + rest.split(end, 1)[1]
    return text


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="exit 1 if docs/instructor.md is stale")
    args = p.parse_args()
    old = GUIDE.read_text()
    new = render(old)
    if args.check:
        if new != old:
            print("docs/instructor.md is stale (timings, reference files or notebooks changed): run "
                  "python scripts/instructor_figures.py and commit it")
            return 1
        return 0
    GUIDE.write_text(new)
    print(f"wrote {GUIDE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
