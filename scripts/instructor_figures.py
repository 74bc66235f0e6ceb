#!/usr/bin/env python3
"""Write the generated tables of docs/instructor.md between its marker comments; --check: fail if stale.

    python scripts/instructor_figures.py           # after new timings or GPU reference files
    python scripts/instructor_figures.py --check   # exit 1 when the guide differs from what its sources give

It also writes each notebook's first-cell line on where its GPU figures were verified (tutorial_lib.reference.banner),
and computes the workshop's time plan: every notebook's core and optional minutes, counted one way (TIME MODEL below).

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
           "06_scaling", "07_your_own_model", "08_when_it_does_not_fit")  # the README's eight; a notebook not written yet gets a row its author fills

# ---------------------------------------------------------------------------------------------------- TIME MODEL
# A notebook's time in a workshop room, counted the same way for every notebook:
#   - its markdown read aloud at WORDS_PER_MINUTE; a collapsed answer (<details>) is not read aloud;
#   - the printed output of each code cell read at OUTPUT_WORDS_PER_MINUTE (from the committed outputs);
#   - each code cell typed and run at a room's pace, MINUTES_PER_CODE_CELL (someone always falls behind);
#   - each question of a "## Questions" section discussed, MINUTES_PER_QUESTION;
#   - the cell's compute on a GPU node from docs/notebook_timings_gpu.json (the reference card's run).
# A section whose heading ends with "(optional)" is optional up to the next heading of the same or a higher
# level; the rest is core. Each notebook's first cell states the result as
# "**Time:** core about N min, optional about M min."; tests/test_notebook_rules.py recomputes it.
WORDS_PER_MINUTE = 130
OUTPUT_WORDS_PER_MINUTE = 150
MINUTES_PER_CODE_CELL = 1.5
MINUTES_PER_QUESTION = 1.5
DAY_MINUTES = 330  # a one-day workshop's contact time on a GPU node, breaks excluded: 5 h 30
# Core sections the plan moves to the second day so that the first day's core path fits DAY_MINUTES: notebook ->
# headings (as written, without '#'). Day two starts with notebook 08 "When it does not fit" where it exists.
DAY_TWO = {
    "08_when_it_does_not_fit": None,  # None: the whole notebook (00-07's core path fits the first day)
}
TIME_LINE = re.compile(r"\*\*Time:\*\* core about (\d+) min, optional about (\d+) min\b")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$", re.M)
WORD = re.compile(r"[A-Za-z0-9][\w'’.+-]*")


def _cells(name: str) -> list[dict]:
    path = ROOT / "notebooks" / f"{name}.ipynb"
    return json.loads(path.read_text())["cells"] if path.is_file() else []


def _first_line(source: str) -> str:
    lines = [x for x in source.splitlines() if x.strip() and not x.startswith("# NBVAL")]
    return lines[0][:80] if lines else ""


def gpu_seconds(name: str, cells: list[dict] | None = None) -> dict[int, float]:
    """Cell index -> seconds its code took on a GPU node: the slowest cells by their first line, the rest of the
    notebook's time shared evenly by the other code cells (0 everywhere when it was never timed there)."""
    cells = _cells(name) if cells is None else cells
    code = [i for i, c in enumerate(cells) if c["cell_type"] == "code"]
    runs = json.loads(GPU_TIMINGS.read_text())["notebooks"] if GPU_TIMINGS.is_file() else {}
    run = runs.get(name)
    if run is None or not code:
        return dict.fromkeys(code, 0.0)
    out, named = {}, 0.0
    for _, seconds, text in run["slowest"]:
        match = next((i for i in code if i not in out and _first_line("".join(cells[i]["source"])) == text), None)
        if match is not None:
            out[match], named = seconds, named + seconds
    rest = [i for i in code if i not in out]
    share = max(0.0, run["seconds"] - named) / len(rest) if rest else 0.0
    return {**out, **{i: share for i in rest}}


def _headings(markdown: str) -> list:
    """The heading matches of a markdown cell, leaving out lines inside ``` code fences (a '# comment' there)."""
    fenced, inside, offset = [], False, 0
    for line in markdown.splitlines(keepends=True):
        if line.lstrip().startswith("```"):
            inside = not inside
        if inside or line.lstrip().startswith("```"):
            fenced.append((offset, offset + len(line)))
        offset += len(line)
    return [m for m in HEADING.finditer(markdown) if not any(a <= m.start() < b for a, b in fenced)]


DETAILS = re.compile(r"<details>.*?</details>", re.S)
QUESTION = re.compile(r"^\d+\. ", re.M)


def printed(cell: dict) -> str:
    """What a code cell printed in the committed outputs: streams, and each result once (markdown over plain)."""
    out = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            out.append("".join(o.get("text", "")))
        data = o.get("data", {})
        for kind in ("text/markdown", "text/plain"):
            if kind in data and "image/png" not in data:
                out.append("".join(data[kind]))
                break
    return "\n".join(out)


def _markdown_minutes(text: str, questions: bool) -> float:
    """Minutes of a run of markdown: read aloud except its collapsed answers, plus its questions discussed."""
    text = DETAILS.sub(" ", text)
    asked = len(QUESTION.findall(text)) * MINUTES_PER_QUESTION if questions else 0.0
    return len(WORD.findall(text)) / WORDS_PER_MINUTE + asked


def _code_minutes(cell: dict, gpu_s: float) -> float:
    return MINUTES_PER_CODE_CELL + len(WORD.findall(printed(cell))) / OUTPUT_WORDS_PER_MINUTE + gpu_s / 60


def minutes(name: str, moved: list[str] | None = None) -> dict:
    """{"core": min, "optional": min, "moved": min, "optional_sections": [titles]} of a notebook by the TIME MODEL;
    the sections titled in `moved` (None: the whole notebook) are counted in "moved", not in "core"."""
    cells = _cells(name)
    gpu = gpu_seconds(name, cells)
    totals, titles = {"core": 0.0, "optional": 0.0, "moved": 0.0}, []
    stack: list[tuple[int, str, str]] = []  # open headings: (level, core / optional / moved, title)

    def kind() -> str:
        kinds = [k for _, k, _ in stack]
        return "optional" if "optional" in kinds else "moved" if "moved" in kinds else "core"

    for i, cell in enumerate(cells):
        source = "".join(cell["source"])
        if cell["cell_type"] == "code":
            totals[kind()] += _code_minutes(cell, gpu.get(i, 0.0))
            continue
        if cell["cell_type"] != "markdown":
            continue
        pos = 0
        for m in _headings(source) + [None]:
            text = source[pos:m.start() if m else len(source)]
            totals[kind()] += _markdown_minutes(text, any(t.startswith("Questions") for t in _titles(stack)))
            if m is None:
                break
            level, title = len(m.group(1)), m.group(2)
            while stack and stack[-1][0] >= level:
                stack.pop()
            what = ("optional" if title.endswith("(optional)") else
                    "moved" if moved is not None and title in moved else "core")
            stack.append((level, what, title))
            if what == "optional":
                titles.append(title)
            totals[kind()] += len(WORD.findall(title)) / WORDS_PER_MINUTE
            pos = m.end()
    return {**{k: round(v, 1) for k, v in totals.items()}, "optional_sections": titles}


def _titles(stack: list) -> list[str]:
    return [t for *_, t in stack]


def stated(name: str) -> tuple[int, int] | None:
    """(core, optional) minutes a notebook's first cell states, or None."""
    cells = _cells(name)
    m = TIME_LINE.search("".join(cells[0]["source"])) if cells else None
    return (int(m.group(1)), int(m.group(2))) if m else None


CARD_CALL = re.compile(r"\btl\.card\((.*)")
DDP_GPUS_ARG = re.compile(r"\bddp_gpus\s*=\s*([\w.]+)")


def _card_ddp_gpus(cells: list[dict], source: str) -> bool:
    """Whether a cell's tl.card call measures DDP on a node with the GPUs: its ddp_gpus is left out (auto) or is
    not 0, where a name is looked up in the notebook's cells (DDP_GPUS = 0). A cell that catches tl.UserError shows
    the card refusing its input, before anything runs."""
    if "except tl.UserError" in source:
        return False
    for call in CARD_CALL.findall(source):
        arg = DDP_GPUS_ARG.search(call)
        value = arg.group(1) if arg else "None"
        if not value.isdigit() and value != "None":
            code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
            found = re.findall(rf"^{re.escape(value)}\s*=\s*(\w+)", code, re.M)
            value = found[-1] if found else "None"
        if value != "0":
            return True
    return False


def gpu_cells(name: str) -> dict[int, str]:
    """Cell index -> how many GPUs it uses when it has them: '2+' where it tests for at least two, 'all' where it
    uses every GPU of the node (tl.launch, DataParallel on every GPU, a sweep over the GPU counts), '2 or 4' where
    a card measures DDP (on 2 GPUs, or on 4 where the node has 4 or more: lessons/card_ddp.py)."""
    out, cells = {}, _cells(name)
    for i, cell in enumerate(cells):
        source = "".join(cell["source"]) if cell["cell_type"] == "code" else ""
        at_least = re.findall(r"(?:S\.gpus|device_count\(\))\s*>=\s*(\d+)", source)
        if at_least:
            out[i] = f"{max(map(int, at_least))}+"
        elif re.search(r"nproc\s*=|S\.gpus|NPROC|\bGPUS\b", source):  # not DDP_GPUS, the card's parameter
            out[i] = "all"
        elif _card_ddp_gpus(cells, source):
            out[i] = "2 or 4"
    return out


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
    parts = [torch_versions([reference.load(p.stem) for p in files])]
    for path in files:
        record = reference.load(path.stem)
        host = f", host {record['host']}" if record.get("host") else ""  # recorded since 2026-11-28
        rows = [f"**{path.stem}**: on {reference.where(record)}{host} (`{record['script']}`)", "",
                "| figure | value |", "| --- | --- |"]
        for key, value in record["figures"].items():
            if isinstance(value, float):
                shown = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"  # 59,362 img/s, not 5.936e+04
            elif isinstance(value, list) and value and all(isinstance(v, float) for v in value):
                shown = "[" + ", ".join(f"{v:.4g}" for v in value) + "]"  # a series of figures, as each is shown
            else:
                shown = str(value).replace("|", "\\|")
            if len(shown) > LONGEST:  # a table of rows or a curve: the notebook shows it, the file holds it
                shown = f"({type(value).__name__} of {len(value)}: see notebooks/reference/{path.name})"
            rows.append(f"| {key} | {shown} |")
        parts.append("\n".join(rows))
    return "\n\n".join(parts)


def pinned_torch() -> str | None:
    """The torch version the set-up installs (requirements.lock), or None."""
    lock = ROOT / "requirements.lock"
    m = re.search(r"^torch==([^\s;#]+)", lock.read_text(), re.M) if lock.is_file() else None
    return m.group(1) if m else None


def torch_versions(records: list[dict]) -> str:
    """Which torch the reference files were measured with, against the one the set-up installs: a figure made
    with another torch may differ from what the room sees (compile caches, kernels and defaults change)."""
    made = sorted({r["torch"] for r in records})
    pinned = pinned_torch()
    said = " and ".join(f"torch {v}" for v in made)
    if pinned is None or all(v.split("+")[0] == pinned for v in made):
        return f"These files were measured with {said}, the torch the set-up installs."
    return (f"These files were measured with {said}; the set-up installs torch {pinned} (`requirements.lock`), so "
            "what your room sees with it may differ from them until the GPU scripts are run again with that torch.")


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


def day_one(names: list[str]) -> dict[str, float]:
    """Notebook -> its core minutes on the first day: its core path less the sections DAY_TWO moves (a notebook
    DAY_TWO moves whole is left out)."""
    out = {}
    for n in names:
        if n in DAY_TWO and DAY_TWO[n] is None:
            continue
        out[n] = minutes(n, DAY_TWO.get(n))["core"]
    return out


def day_two(names: list[str]) -> list[str]:
    """What the plan moves to the second day, in words: notebook 08 first where it exists, then each moved
    notebook or section with its minutes."""
    out = [f"{n} (all of it, {minutes(n)['core']:.0f} min)" for n in names if n.startswith("08")]
    for n in names:
        if n in DAY_TWO and not n.startswith("08"):
            if DAY_TWO[n] is None:
                out.append(f"{n} (its core, {minutes(n)['core']:.0f} min)")
            else:
                moved = minutes(n, DAY_TWO[n])["moved"]
                out.append(f"{n} sections {'; '.join(DAY_TWO[n])} ({moved:.0f} min)")
    return out


def plan() -> str:
    """The workshop's time plan from the TIME MODEL: core and optional minutes of every notebook, the first day's
    core path (DAY_TWO moved out), the second day, and which cells use more than one GPU."""
    names = sorted(set(PLANNED) | {p.stem for p in (ROOT / "notebooks").glob("*.ipynb")})
    names = [n for n in names if _cells(n)]
    got = {n: minutes(n) for n in names}
    rows = ["| notebook | core min | optional min | optional sections | its header says (core, optional) | "
            "day one, core min | cells that use more than one GPU |", "| --- | ---: | ---: | --- | --- | ---: | --- |"]
    first = day_one(names)
    for n in names:
        m, said, gpus = got[n], stated(n), gpu_cells(n)
        sections = "; ".join(t.removesuffix(" (optional)") for t in m["optional_sections"]) or "-"
        rows.append(f"| {n} | {m['core']:.0f} | {m['optional']:.0f} | {sections} | "
                    f"{'%d, %d' % said if said else 'no Time line'} | "
                    f"{round(first[n]) if n in first else 'day two'} | "
                    f"{', '.join(f'cell {i} ({k})' for i, k in gpus.items()) or 'none'} |")
    core = sum(round(m["core"]) for m in got.values())
    optional = sum(round(m["optional"]) for m in got.values())
    day = sum(round(v) for v in first.values())
    rows.append(f"| **all** | **{core}** | **{optional}** | | | **{day}** | |")
    fits = "fits" if day <= DAY_MINUTES else "does NOT fit"
    return "\n".join(rows + [
        "",
        f"**Day one, the core path:** {day} min of contact time ({day / 60:.1f} h, breaks excluded), which {fits} "
        f"a day of {DAY_MINUTES // 60} h {DAY_MINUTES % 60:02d}: " + ", ".join(f"{n[:2]} {round(v)}" for n, v in
                                                                             first.items()) + " min. "
        "Skip the optional sections' discussion, not their cells: run them without explaining (later cells may use "
        "what they made) and point learners to them for later.",
        "",
        "**Day two:** " + ("; ".join(day_two(names)) or "nothing moved") + f"; then the optional sections "
        f"({optional} min) and the exercises.",
        "",
        "**GPUs:** every notebook runs on a node with 0, 1, 2 or 4 GPUs. On one GPU, a cell marked `all` or `2+` "
        "shows the reference run's figures or writes the job that runs it; `all` uses every GPU of the node. A cell "
        "marked `2 or 4` is a card that measures DDP on 2 GPUs, or on 4 where the node has 4 or more; on fewer than "
        "2 it prints a line saying it was not measured."])


def time_line(name: str, first: str) -> str:
    """The first cell with its '**Time:**' minutes as the TIME MODEL counts them (unchanged without that line)."""
    got = minutes(name)
    return TIME_LINE.sub(f"**Time:** core about {round(got['core'])} min, optional about {round(got['optional'])} min",
                         first, count=1)


def write_headers(check: bool = False, only: list[str] | None = None) -> list[str]:
    """Write (check: compare) the lines of each notebook's first cell that the guide's sources give: its minutes
    by the TIME MODEL, and where and when its GPU figures were verified (reference.banner), in place of its
    '**GPU figures' paragraph or after the '**Time:**' one. `only`: these notebooks' stems."""
    import nbformat

    stale = []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        if only is not None and path.stem not in only:
            continue
        nb = nbformat.read(path, as_version=4)
        first, line = nb.cells[0]["source"], reference.banner(path)
        new = first if check else time_line(path.stem, first)  # the test holds the minutes within 15%
        m = re.search(r"^\*\*GPU figures.*?(?=\n\n|\Z)", new, re.M | re.S)
        if m:
            new = new[:m.start()] + line + new[m.end():]
        else:
            time = re.search(r"^\*\*Time:\*\*.*?(?=\n\n|\Z)", new, re.M | re.S)
            at = time.end() if time else len(new)
            new = new[:at] + "\n\n" + line + new[at:]
        if new == first:
            continue
        stale.append(path.name)
        if not check:
            nb.cells[0]["source"] = new
            nbformat.write(nb, path)
    return stale


BLOCKS = {"timings": timings_table, "plan": plan, "gpu-figures": gpu_figures, "solutions": solutions}


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
    p.add_argument("--headers", nargs="+", metavar="NN_name", help="write only these notebooks' first cells")
    args = p.parse_args()
    old = GUIDE.read_text()
    new = render(old)
    if args.check:
        stale = write_headers(check=True)
        if new != old or stale:
            print("docs/instructor.md or the first cells of " + (", ".join(stale) or "no notebook") + " are stale "
                  "(timings, reference files or notebooks changed): run python scripts/instructor_figures.py and commit")
            return 1
        return 0
    headers = write_headers(only=args.headers)  # first: the minutes the plan shows count the headers' words
    GUIDE.write_text(render(old))
    print(f"wrote {GUIDE.relative_to(ROOT)}" + "".join(f", the first cell of {n}" for n in headers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
