"""Readability of a notebook as a learner meets it, from its source and its committed outputs (no execution):
core markdown words (optional sections, exercises and collapsed answers left out), the longest sentence, the
printed output of each core cell (at most a screen) and the job-file lines printed (never a whole file: its key
lines and its path). `python tests/test_readability.py` prints the report for every notebook."""
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_CORE_WORDS = 1200  # core markdown words per notebook: the public guides on the same topics hold 700-3,000
MAX_SENTENCE = 35  # words
MAX_CELL_LINES = 40  # printed lines of one core cell: a screen
MAX_JOB_LINES = 4  # #SBATCH lines printed by one cell: key lines, never the file
HEADING = re.compile(r"^(#+)\s+(.*)")
OUT_OF_CORE = re.compile(r"\(optional\)\s*$|^(exercises|answers)", re.I)
JOB_LINE = re.compile(r"^#SBATCH\b|^#!/bin/(ba)?sh", re.M)


def _sections(nb: dict):
    """(cell, in the core path) for every cell: a heading ending '(optional)' or named Exercises/Answers starts a
    part outside the core up to the next heading of the same or a higher level."""
    skip = None
    for c in nb["cells"]:
        lines = "".join(c["source"]).splitlines() if c["cell_type"] == "markdown" else []
        kept = []
        for line in lines:
            m = HEADING.match(line)
            if m:
                level = len(m.group(1))
                if skip is not None and level <= skip:
                    skip = None
                if skip is None and OUT_OF_CORE.search(m.group(2)):
                    skip = level
            if skip is None:
                kept.append(line)
        yield c, skip is None, "\n".join(kept)


def core_markdown(nb: dict) -> str:
    text = "\n".join(kept for c, _, kept in _sections(nb) if c["cell_type"] == "markdown")
    text = re.sub(r"<details>.*?</details>", " ", text, flags=re.S)
    return re.sub(r"```.*?```", " ", text, flags=re.S)


def sentences(text: str) -> list[str]:
    text = re.sub(r"`[^`]*`", "X", text)
    text = re.sub(r"^\|.*\|\s*$", " ", text, flags=re.M)  # tables
    text = re.sub(r"^#+\s+.*$", " ", text, flags=re.M)  # headings
    parts = re.split(r"(?<=[.!?:;])\s+|\n\s*\n|\n\s*[-*] |\n\s*\d+\. ", text)
    return [p for p in parts if p.strip()]


def printed(cell: dict) -> str:
    out = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            out.append("".join(o.get("text", "")))
        data = o.get("data", {})
        for kind in ("text/markdown", "text/plain"):
            if kind in data and "image/png" not in data:
                out.append("".join(data[kind]))
                break
    return "".join(out)


def measure(nb: dict) -> dict:
    md = core_markdown(nb)
    longest = max(sentences(md), key=lambda s: len(s.split()), default="")
    core_cells = [(i, printed(c)) for i, (c, core, _) in enumerate(_sections(nb))
                  if core and c["cell_type"] == "code"]
    all_cells = [(i, printed(c)) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"]
    tallest = max(core_cells, key=lambda x: len(x[1].splitlines()), default=(None, ""))
    jobs = max(all_cells, key=lambda x: len(JOB_LINE.findall(x[1])), default=(None, ""))
    return {"core_words": len(md.split()), "longest_sentence": len(longest.split()), "longest": " ".join(longest.split()),
            "core_printed_words": sum(len(t.split()) for _, t in core_cells),
            "tallest_cell": tallest[0], "tallest_lines": len(tallest[1].splitlines()),
            "job_lines": sum(len(JOB_LINE.findall(t)) for _, t in all_cells),
            "job_cell": jobs[0], "job_cell_lines": len(JOB_LINE.findall(jobs[1])),
            "plots": sum("image/png" in o.get("data", {}) for c in nb["cells"] for o in c.get("outputs", []))}


def problems(m: dict) -> list[str]:
    out = []
    if m["core_words"] > MAX_CORE_WORDS:
        out.append(f"{m['core_words']} core markdown words > {MAX_CORE_WORDS}: say it in fewer")
    if m["longest_sentence"] > MAX_SENTENCE:
        out.append(f"a sentence of {m['longest_sentence']} words > {MAX_SENTENCE}: {m['longest'][:100]!r}...")
    if m["tallest_lines"] > MAX_CELL_LINES:
        out.append(f"cell {m['tallest_cell']} prints {m['tallest_lines']} lines > a screen ({MAX_CELL_LINES})")
    if m["job_cell_lines"] > MAX_JOB_LINES:
        out.append(f"cell {m['job_cell']} prints a job file ({m['job_cell_lines']} job lines): print its key lines "
                   "and its path")
    return out


def report(paths) -> str:
    rows = []
    for p in paths:
        m = measure(json.loads(Path(p).read_text()))
        rows.append(f"{Path(p).stem}: core md {m['core_words']} words, longest sentence {m['longest_sentence']}, "
                    f"core cells print {m['core_printed_words']} words (tallest: cell {m['tallest_cell']}, "
                    f"{m['tallest_lines']} lines), {m['job_lines']} job-file lines printed, {m['plots']} plots")
    return "\n".join(rows)


NOTEBOOKS = [pytest.param(p, id=p.stem) for p in sorted((ROOT / "notebooks").glob("*.ipynb"))]


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_a_notebook_reads_at_a_workshops_pace(notebook):
    m = measure(json.loads(notebook.read_text()))
    assert not problems(m), f"{notebook.name}: " + "; ".join(problems(m)) + "\n" + report([notebook])


def _nb(markdown: list[str], printed_text: str = "") -> dict:
    cells = [{"cell_type": "markdown", "source": s} for s in markdown]
    cells.append({"cell_type": "code", "source": "x", "outputs": [{"output_type": "stream", "text": printed_text}]})
    return {"cells": cells}


def test_the_measures_see_what_a_learner_sees():
    long = " ".join(["word"] * 40) + "."
    nb = _nb(["# T\n\nShort one. " + long, "## Exercises (optional)\n\n" + " ".join(["x"] * 2000),
              "<details><summary>Answers</summary>\n\n" + " ".join(["y"] * 2000) + "\n</details>"],
             "#!/bin/bash\n" + "#SBATCH --x\n" * 6 + "line\n" * 50)
    m = measure(nb)
    assert m["longest_sentence"] == 40 and m["core_words"] == 44  # heading, 'Short one.' and the long one
    assert m["tallest_lines"] == 0  # the code cell sits under Exercises: not core
    assert m["job_lines"] == 7 and m["job_cell_lines"] == 7
    said = " ".join(problems(m))
    assert "a sentence of 40 words" in said and "prints a job file" in said
    core = _nb(["# T\n\n" + " ".join(["w."] * 1300)], "line\n" * 41)
    assert [p.split()[0] for p in problems(measure(core))] == ["1302", "cell"]
    assert not problems(measure(_nb(["# T\n\nA sentence. Another one."], "resources: 1 GPU\nline\n")))


if __name__ == "__main__":
    print(report(sys.argv[1:] or sorted((ROOT / "notebooks").glob("*.ipynb"))))


# (notebook, what the cell that draws the picture calls) -> its committed output holds the picture
PICTURES = [("01_single_gpu", "plt.semilogy(loss"), ("02_profiling", "profiled vs unprofiled step"),
            ("03_data_loading", "tl.data_loading.plot_ladder("), ("03_data_loading", "tl.data_loading.plot_sweep(")]


@pytest.mark.parametrize("stem,call", PICTURES, ids=[f"{s}-{c.split('(')[0][-14:]}" for s, c in PICTURES])
def test_each_picture_is_in_the_committed_outputs(stem, call):
    """01's loss on a log axis, 02's profiled vs unprofiled step as stacked bars, 03's ladder as a range plot
    and its sweep: the cell that draws each one holds an image in the committed (CPU) outputs."""
    cells = json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text())["cells"]
    drawing = [c for c in cells if c["cell_type"] == "code" and call in "".join(c["source"])]
    assert drawing, f"{stem}: no cell calls {call!r} (the picture is gone?)"
    assert any("image/png" in o.get("data", {}) for c in drawing for o in c.get("outputs", [])), (
        f"{stem}: the cell calling {call!r} has no picture in its committed outputs: execute the notebook again")
