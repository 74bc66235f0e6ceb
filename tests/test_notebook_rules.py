"""Rules every committed notebook keeps, read from its source (no execution): no GPU figure typed by hand,
an answer for every question, TensorBoard stopped by the notebook that starts it, Slurm submission opt-in."""
import json
import re
import sys
from pathlib import Path

import pytest

from tutorial_lib import reference

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CARD = re.compile(r"\b(H100|H200|A100|V100|L40S?|GH200|B200|MI250X?|MI300X?)\b")
FIGURE = re.compile(r"\d{1,3}(,\d{3})+|\d{4,}|\d+(\.\d+)?\s*(ms|img/s|images/s|GB|MB|x\b|%)")


def cells(notebook: Path) -> list[tuple[str, str]]:
    return [(c["cell_type"], "".join(c["source"])) for c in json.loads(notebook.read_text())["cells"]]


def typed_gpu_figures(text: str) -> list[str]:
    """Paragraphs (a table is one) of markdown that name a GPU and give a number: figures that should come from a
    reference file."""
    return [p.strip() for p in re.split(r"\n\s*\n", text) if CARD.search(p) and FIGURE.search(p)]


def test_typed_gpu_figures_are_found():
    assert typed_gpu_figures("| configuration | images/s (H200) |\n| --- | --- |\n| bf16 | ~30,000 |")
    assert typed_gpu_figures("On an H100 the step takes 8.7 ms.")
    assert not typed_gpu_figures("On an H100 or H200 the step is shorter.")


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_gpu_figure_is_typed_into_markdown(notebook):
    typed = [s for kind, text in cells(notebook) if kind == "markdown" for s in typed_gpu_figures(text)
             if s != reference.banner(notebook)]  # the first cell's line on the reference runs is generated
    assert not typed, f"{notebook.name}: GPU figures typed by hand (record and show them with tl.reference): {typed}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_question_section_has_answers(notebook):
    text = "\n".join(t for kind, t in cells(notebook) if kind == "markdown")
    if "## Questions" in text:
        after = text.split("## Questions", 1)[1]
        assert re.search(r"<summary>[^<]*Answers", after), f"{notebook.name}: questions without collapsed answers"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_notebook_that_starts_tensorboard_stops_it(notebook):
    code = [t for kind, t in cells(notebook) if kind == "code"]
    starts = [i for i, t in enumerate(code) if "tensorboard.start(" in t or "start_tensorboard(" in t]
    if starts:
        assert any("tensorboard.stop(" in t for t in code[starts[-1]:]), \
            f"{notebook.name} starts TensorBoard and never stops it (tl.tensorboard.stop() in a last cell)"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_submitting_to_slurm_is_opt_in(notebook):
    code = [t for kind, t in cells(notebook) if kind == "code"]
    if any("jobs.submit(" in t for t in code):
        assert any(re.search(r"^SUBMIT = False", t, re.M) for t in code), \
            f"{notebook.name} submits a job: make it opt-in with SUBMIT = False in the parameters cell"
        assert not any(".wait(" in t for t in code), f"{notebook.name} blocks the kernel on a job (job.wait)"


# ---------------------------------------------------------------------------------------- the workshop day
sys.path.insert(0, str(ROOT / "scripts"))
import instructor_figures as plan  # noqa: E402  (the TIME MODEL, one home for the guide and these tests)

sys.path.remove(str(ROOT / "scripts"))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_header_states_the_minutes_the_time_model_counts(notebook):
    """**Time:** core about N min, optional about M min. -- within 15% (and a minute of rounding) of what the
    notebook holds by the TIME MODEL: its words read aloud, its printed output read, its cells typed and run at a
    room's pace, its questions discussed, its cells' compute on a GPU node."""
    said = plan.stated(notebook.stem)
    assert said, f"{notebook.name}: its first cell lacks '**Time:** core about N min, optional about M min.'"
    got = plan.minutes(notebook.stem)
    for kind, minutes in zip(("core", "optional"), said):
        assert abs(minutes - got[kind]) <= 0.15 * got[kind] + 1, (
            f"{notebook.name} says {kind} about {minutes} min; its cells count {got[kind]:.0f} min by the time "
            "model: run python scripts/instructor_figures.py (it writes the header), or shorten the text")


def test_day_one_holds_the_core_path_and_names_what_moves_to_day_two():
    """Day one's core path fits the day; every section the plan moves to day two exists, and the plan names it."""
    names = [nb.stem for nb in NOTEBOOKS]
    first = plan.day_one(names)
    assert sum(round(v) for v in first.values()) <= plan.DAY_MINUTES, (
        f"day one's core path takes {sum(first.values()):.0f} min, over the day's {plan.DAY_MINUTES}: mark sections "
        f"'(optional)', shorten them, or move them to day two (DAY_TWO in scripts/instructor_figures.py): {first}")
    titles = {nb.stem: {m.group(2) for k, t in cells(nb) if k == "markdown" for m in plan._headings(t)}
              for nb in NOTEBOOKS}
    for name, sections in plan.DAY_TWO.items():
        assert name in titles, f"DAY_TWO names {name}, which is no notebook"
        missing = [s for s in sections or [] if s not in titles[name]]
        assert not missing, f"DAY_TWO moves {missing} of {name}: no such heading (renamed?)"
        assert name in " ".join(plan.day_two(names))
    assert all(plan.minutes(n, plan.DAY_TWO[n])["moved"] > 0 for n in plan.DAY_TWO if plan.DAY_TWO[n])


def test_the_first_day_holds_the_whole_core_path_of_00_to_07():
    """The workshop's eight notebooks fit one day of 5 h 30 by the time model: nothing of 00-07's core path moves
    to day two (notebook 08, the second day's, is the only one DAY_TWO moves)."""
    names = [nb.stem for nb in NOTEBOOKS]
    first = plan.day_one(names)
    day = [n for n in names if n[:2] < "08"]
    assert not [n for n in plan.DAY_TWO if n[:2] < "08"], f"DAY_TWO moves part of 00-07 to day two: {plan.DAY_TWO}"
    assert set(day) <= set(first) and not [n for n in first if n[:2] >= "08"], first
    assert sum(round(first[n]) for n in day) <= plan.DAY_MINUTES, {n: round(first[n]) for n in day}


LESSON_CORE_MINUTES = {"05_dp_vs_ddp": 45, "06_scaling": 45}  # one lesson each: at most 45 min of core path


@pytest.mark.parametrize("name,limit", LESSON_CORE_MINUTES.items())
def test_the_multi_gpu_lessons_core_fits_45_minutes(name, limit):
    """05's core path and 06 are lessons of at most 45 minutes (a workshop slot), by the same count as the header."""
    core = plan.minutes(name)["core"]
    assert round(core) <= limit, (f"{name}'s core path counts {core:.1f} min, over {limit}: shorten its text, or "
                                  "mark a section '(optional)'")


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_optional_is_said_at_the_end_of_a_heading(notebook):
    """The convention the time model reads: '(optional)' ends a heading, and nowhere else marks a section."""
    for kind, text in cells(notebook):
        for line in text.splitlines() if kind == "markdown" else []:
            if "(optional)" in line and line.startswith("#"):
                assert line.rstrip().endswith("(optional)"), f"{notebook.name}: {line!r} (put '(optional)' at the end)"


def test_the_time_model_counts_what_a_room_does(tmp_path, monkeypatch):
    """Markdown read aloud (not the collapsed answers), printed output read, cells typed and run at a room's pace,
    questions discussed, GPU seconds; optional and moved sections apart."""
    md = lambda s: {"cell_type": "markdown", "source": s}  # noqa: E731
    words = lambda n: " ".join(["word"] * n)  # noqa: E731
    code = lambda s, out=0: {"cell_type": "code", "source": s, "outputs": [  # noqa: E731
        {"output_type": "stream", "name": "stdout", "text": words(out)}] if out else []}
    (tmp_path / "notebooks").mkdir()
    nb = {"cells": [md(f"# T\n\n{words(127)}"), code("slow()", out=300), md(f"## 1. More (optional)\n\n{words(258)}"),
                    code("x = 1"), md("```python\n# not a heading\n```"), md(f"## 2. Back\n\n{words(128)}"), code("y"),
                    md(f"## Questions\n\n1. {words(9)}\n2. {words(9)}\n\n<details><summary>Answers</summary>\n\n"
                       f"{words(500)}\n</details>")]}
    (tmp_path / "notebooks" / "99_t.ipynb").write_text(json.dumps(nb))
    (tmp_path / "gpu.json").write_text(json.dumps({"notebooks": {"99_t": {"seconds": 150.0, "slowest": [[1, 120.0, "slow()"]]}}}))
    monkeypatch.setattr(plan, "ROOT", tmp_path)
    monkeypatch.setattr(plan, "GPU_TIMINGS", tmp_path / "gpu.json")
    got = plan.minutes("99_t")
    cell, question = plan.MINUTES_PER_CODE_CELL, plan.MINUTES_PER_QUESTION
    assert cell > 1 and question > 0 and plan.OUTPUT_WORDS_PER_MINUTE == 150 and plan.WORDS_PER_MINUTE == 130
    # core: 1 + 127 words; a cell typed and run, its 120 s and its 300 printed words; 3 + 128 words; a cell and
    # 15 s of the rest; the questions' heading and their 2 x 10 words read, each discussed; the answers not read
    assert got["core"] == pytest.approx(128 / 130 + cell + 2 + 300 / 150 + 131 / 130 + cell + 0.25 + 21 / 130
                                        + 2 * question, abs=0.05)
    # optional: 3 + 258 words, a cell (typed and run + 15 s), the fenced comment: 3 words
    assert got["optional"] == pytest.approx(261 / 130 + cell + 0.25 + 3 / 130, abs=0.05)
    assert got["optional_sections"] == ["1. More (optional)"]
    moved = plan.minutes("99_t", ["2. Back"])
    assert moved["moved"] == pytest.approx(131 / 130 + cell + 0.25, abs=0.05)
    assert moved["core"] + moved["moved"] == pytest.approx(got["core"], abs=0.05)


# ---------------------------------------------------------------------------------------- prose against figures
def _sentence(notebook: str, words: str) -> str:
    text = " ".join(" ".join(t for k, t in cells(ROOT / "notebooks" / f"{notebook}.ipynb") if k == "markdown").split())
    assert words in text, f"{notebook}: the sentence {words!r} is gone; update its check in CLAIMS"
    return words


def _rows(card: str) -> list:
    return reference.load(f"04_ladder_{card}")["figures"]["rows"]


def _eager_gain(card):
    from tutorial_lib.lessons import evidence

    return evidence.largest_gain(_rows(card), ["tf32", "bf16", "channels_last", "fused_adamw"])[0] == "tf32"


def _verdict(card, rung):
    from tutorial_lib.lessons import ladder

    return ladder.verdicts(_rows(card))[rung]


def _compile_gains_little(card):
    """Default compile against the eager rung below it: not faster by the rule, or by less than a quarter."""
    got = {r["rung"]: r for r in _rows(card) if not r["skipped"]}
    return " faster " not in _verdict(card, "compile") or got["compile"]["img_s"] < 1.25 * got["fused_adamw"]["img_s"]


def _mfu_falls_while_faster(card):
    got = {r["rung"]: r for r in _rows(card) if not r["skipped"]}
    return got["bf16"]["img_s"] > got["fp32"]["img_s"] and got["bf16"]["mfu"] < got["fp32"]["mfu"]


def _lines_follow_the_gpu():
    lines, steps = reference.load("02_line_profile")["figures"], reference.load("02_step_breakdown")["figures"]
    return sum(lines.values()) > 0.5 * steps["fp32_unprofiled_step_ms"]


def _host_bound_step_pays_more_for_the_profiler():
    f = reference.load("02_step_breakdown")["figures"]
    ratio = lambda p: f[f"{p}_profiled_step_ms"] / f[f"{p}_unprofiled_step_ms"]  # noqa: E731
    return ratio("bf16") > ratio("fp32") and f["bf16_idle_ms"] > f["bf16_compute_ms"]


def _unsynced_is_a_fraction():
    f = reference.load("01_sync_timing")["figures"]
    return f["unsynced_ms"] < 0.7 * f["synced_median_ms"]


def _submitters_are(*numbers):
    code = {nb.stem[:2]: " ".join(t for k, t in cells(nb) if k == "code") for nb in NOTEBOOKS}
    return sorted(n for n, text in code.items() if "jobs.submit(" in text) == list(numbers)


def _workers_wait_and_pinning_cuts_it():
    """8 workers: input-bound (the step waits for data); pinned, persistent workers: a wait of a few percent."""
    from tutorial_lib.lessons import bench

    f = reference.load("03_loader_ladder")["figures"]
    workers = bench.from_reference(f, "workers")
    pinned_step_ms = 1000 * f["batch_size"] / f["pinned_full"] if "batch_size" in f else None
    # the bound the run printed, which counts its wait for data (the record keeps no windows to judge it again)
    said = f.get("workers_bound") or bench.bound(workers)
    return said in ("input", "bursts") and f["pinned_wait_ms"] < f["workers_wait_ms"] / 2 \
        and (pinned_step_ms is None or f["pinned_wait_ms"] < 0.1 * pinned_step_ms)


# (notebook, words of a sentence that names a direction, the check of the figures it stands beside, on every card)
CLAIMS = [
    ("04_mixed_precision", "moving fp32 onto them is the change that counts",
     lambda: all(_eager_gain(c) for c in ("h100", "h200"))),
    ("04_mixed_precision", "so on a launch-bound step it gains little, and on some cards it is slower",
     lambda: all(_compile_gains_little(c) for c in ("h100", "h200"))
     and any(" slower " in _verdict(c, "compile") for c in ("h100", "h200"))),
    ("04_mixed_precision", "a rung can get faster while its MFU falls",
     lambda: all(_mfu_falls_while_faster(c) for c in ("h100", "h200"))),
    ("02_profiling", "the three lines add up to most of the step", _lines_follow_the_gpu),
    ("02_profiling", "Where the host is the limit, every extra microsecond of it makes the step longer",
     _host_bound_step_pays_more_for_the_profiler),
    ("01_single_gpu", "the time Python took to queue the kernels, a fraction of the real step",
     _unsynced_is_a_fraction),
    ("03_data_loading", "pinned, persistent workers cut that wait to a few percent of the step",
     _workers_wait_and_pinning_cuts_it),
    ("00_setup", "notebooks 01, 05 and 06 submit theirs only when you set", lambda: _submitters_are("01", "05", "06")),
    ("04_mixed_precision", "Batch 1024 is faster per image than batch 256.",
     lambda: all(" slower " in _verdict(c, "last_small_batch") for c in ("h100", "h200"))),
    ("03_data_loading", "notebook 04 makes the step several times faster",
     lambda: all(reference.load(f"04_ladder_{c}")["figures"]["last_speedup"] > 3 for c in ("h100", "h200"))),
]


@pytest.mark.parametrize("notebook, words, check", CLAIMS, ids=[f"{n[:2]}: {w[:40]}" for n, w, _ in CLAIMS])
def test_a_sentence_that_names_a_direction_agrees_with_the_reference_figures(notebook, words, check):
    """Prose against the figures beside it: each sentence of learner text that states which way a GPU figure
    goes is checked against every reference run it stands beside; a new reference run that turns the direction
    around fails here, and the sentence must change with it."""
    _sentence(notebook, words)
    assert check(), f"{notebook}: {words!r} no longer agrees with notebooks/reference/"


def test_no_markdown_types_a_measured_ratio_beside_a_direction():
    """A ratio or percentage typed next to 'faster'/'slower' is a figure a noisy run decides: print it from a cell."""
    typed = re.compile(r"\d[\d.,]*\s*(x|×|%|times)\s+(faster|slower)\b|\b(faster|slower)\b by \d", re.I)
    found = [(nb.name, m.group(0)) for nb in NOTEBOOKS[:5] for kind, text in cells(nb) if kind == "markdown"
             for m in typed.finditer(re.sub(r"```.*?```", "", text, flags=re.S))]
    assert not found, found


def test_the_readme_table_lists_every_notebook_as_written():
    """The README's table: one row per notebook present, none of them marked '(planned)'."""
    rows = re.findall(r"^\| (\d\d) \| `(\w+)`( \(planned\))? \|", (ROOT / "README.md").read_text(), re.M)
    listed = {name: planned for _, name, planned in rows}
    for nb in NOTEBOOKS:
        assert nb.stem in listed, f"README.md's table lacks {nb.stem}"
        assert not listed[nb.stem], f"README.md marks {nb.stem} '(planned)', but it is written"


def outputs(notebook: Path) -> list[tuple[str, list]]:
    return [("".join(c["source"]), c.get("outputs", [])) for c in json.loads(notebook.read_text())["cells"]
            if c["cell_type"] == "code"]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_reference_figures_are_shown_once(notebook):
    """tl.reference.show prints the figures; a cell that also echoed a value would show them a second time."""
    for source, outs in outputs(notebook):
        if "reference.show(" in source:
            echoed = [o for o in outs if o.get("output_type") == "execute_result"]
            assert not echoed, f"{notebook.name}: a cell with reference.show also echoes a value: {source[:80]!r}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_outputs_hold_a_progress_bars_last_state_only(notebook):
    """scripts/run_notebooks.py keeps what a browser shows: one stream per run of outputs, no overwritten '\\r' text."""
    for source, outs in outputs(notebook):
        for a, b in zip(outs, outs[1:]):
            assert not (a.get("output_type") == b.get("output_type") == "stream" and a["name"] == b["name"]), (
                f"{notebook.name}: split stream outputs in {source[:60]!r}: run it with scripts/run_notebooks.py")
        for o in outs:
            text = "".join(o.get("text", "")) if o.get("output_type") == "stream" else ""
            assert not re.search(r"\r(?!\n)", text.rstrip("\r")), f"{notebook.name}: a progress bar's old states in {source[:60]!r}"


# ---------------------------------------------------------------------------------------- learner vocabulary
INTERNAL = {  # what a learner can't follow without reading the workbook's own history or scripts
    "a commit hash": re.compile(r"\bcommit\s+[0-9a-f]{7,40}\b|(?<![\w/.#-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])"
                                r"[0-9a-f]{7,40}(?![\w/.-])"),
    "an issue or PR number": re.compile(r"(?i)\b(issue|PR|pull request)s?\b\s*#?\d+|\w+/\w+#\d+|(?<![\w&])#\d{2,}\b"),
    "a target from the workbook's issues": re.compile(r"(?i)\bthe issue'?s\b|\bour issues?\b"),
    "'seed' for a source guide": re.compile(r"(?i)\bseed\s+0\d\d\b|\bseed (guide|tutorial|workshop|document|"
                                             r"notebook|source)s?\b|\bthe seed's\b"),
    "an internal case name": re.compile(r"(?<![\w/.-])(?:\w+_)?\d+gpu(?:_\w+)?(?![\w/.-])|(?<![\w/.-])"
                                        r"ddp_(?:ro|graph|fast|before|eager)\w*|\btta\b"),
}


def learner_text(notebook: Path) -> list[tuple[str, str]]:
    """(where, text) of every markdown cell and every printed output (streams, text, Markdown) of a notebook."""
    out = []
    for i, cell in enumerate(json.loads(notebook.read_text())["cells"]):
        if cell["cell_type"] == "markdown":
            out.append((f"cell {i} (markdown)", "".join(cell["source"])))
        for o in cell.get("outputs", []):
            data = o.get("data", {})
            for text in (o.get("text"), data.get("text/plain"), data.get("text/markdown")):
                if text:
                    out.append((f"cell {i} (output)", "".join(text)))
    return out


def internal_words(text: str) -> list[str]:
    return [f"{what}: {m.group(0)!r}" for what, pattern in INTERNAL.items() for m in pattern.finditer(text)]


def test_internal_words_are_found():
    assert internal_words("before commit 097c885 the step")
    assert internal_words("pytorch/pytorch#191744 would share them") and internal_words("see PR 12")
    assert internal_words("a workshop of the kind this workbook grew from (seed 001)")
    assert internal_words("dp_4gpu_efficiency 0.06") and internal_words("ddp_ro_split") and internal_words("tta_1gpu_s")
    assert internal_words("below the issue's 45% MFU")
    assert not internal_words("torchrun --nproc_per_node=4 out_dir=runs/06_scaling/cell/weak_b16_2gpu seed=0")
    assert not internal_words("jobs/06_scaling_4gpu.sbatch on 4 GPUs; the same seed on 1 GPU; ddp_sync=flat")


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_learner_text_holds_no_internal_vocabulary(notebook):
    """Markdown and printed output speak to a learner: no commit hashes, issue or PR numbers, targets from the
    workbook's issues, 'seed' for a source guide, or the GPU scripts' internal case names (a path or a file name,
    which a learner can open, is fine)."""
    found = [f"{where}: {w}" for where, text in learner_text(notebook) for w in internal_words(text)]
    assert not found, f"{notebook.name}: " + "; ".join(found)


@pytest.mark.parametrize("notebook", [p for p in NOTEBOOKS if p.stem[:2] in ("05", "06")], ids=lambda p: p.stem)
def test_multi_gpu_cells_ask_gpus_for_instead_of_counting_gpus_themselves(notebook):
    """A cell that needs several GPUs goes through tl.notebook.gpus_for (one banner on a server with fewer), so
    that no cell runs DDP on one process, sweeps one point, or divides by a missing run."""
    code = "\n".join(t for kind, t in cells(notebook) if kind == "code" and not t.startswith("%%writefile"))
    assert "gpus_for(" in code
    assert not re.search(r"S\.gpus\s*[<>=]|max\(S\.gpus|device_count\(\)\s*[<>]", code), \
        f"{notebook.name} decides on the GPU count itself: use tl.notebook.gpus_for"


@pytest.mark.parametrize("gpus, device, small, need, on_cpu, uses, banner", [
    (4, "cuda", False, 2, 2, 4, None), (2, "cuda", False, 4, 2, 0, "needs 4 GPUs; this server has 2 GPUs"),
    (1, "cuda", False, 2, 2, 0, "needs 2 GPUs; this server has 1 GPU:"),
    (0, "cpu", True, 2, 2, 2, None), (0, "cpu", True, 2, 0, 0, "needs 2 GPUs; this server has no GPU")])
def test_the_banner_path_of_a_server_with_fewer_gpus_than_a_cell_needs(capsys, gpus, device, small, need, on_cpu,
                                                                       uses, banner):
    from tutorial_lib import notebook

    s = notebook.Session(small=small, why="test", device=device, gpus=gpus)
    assert notebook.gpus_for(s, need, "DDP", on_cpu=on_cpu, instead="the reference run shows it") == uses
    out = capsys.readouterr().out
    if banner:
        assert out.count("**") == 2 and banner in out and "the reference run shows it" in out
    else:
        assert out == ""


def test_the_banner_is_said_once_per_notebook(capsys):
    """On a server with one GPU the parameters cell says what needs 2 GPUs; a later cell that needs as many
    returns 0 without saying it again (the notebooks promise to say so once); one that needs more says so."""
    from tutorial_lib import notebook

    s = notebook.Session(small=False, why="test", device="cuda", gpus=1)
    assert notebook.gpus_for(s, 2, "DDP", instead="the reference run shows it") == 0
    assert capsys.readouterr().out.count("needs 2 GPUs") == 1
    assert notebook.gpus_for(s, 2, "DataParallel", on_cpu=0, instead="below") == 0
    assert capsys.readouterr().out == ""
    assert notebook.gpus_for(s, 4, "a sweep", instead="below") == 0
    assert "needs 4 GPUs" in capsys.readouterr().out
    cpu = notebook.Session(small=True, why="test", device="cpu", gpus=0)
    assert notebook.gpus_for(cpu, 2, "DDP") == 2 and notebook.gpus_for(cpu, 2, "DataParallel", on_cpu=0) == 0
    assert capsys.readouterr().out.count("needs 2 GPUs") == 1  # the first cell that needs them on a CPU says it
