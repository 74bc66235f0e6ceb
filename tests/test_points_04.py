"""Notebook 04 as a learner meets it, read from its source and committed (CPU) outputs and held against the GPU
reference runs (notebooks/reference/04_*.json): jargon introduced before it is used, no printed line that is the
workbook's own history, each question's premise agreeing with the figures it points at, no column that can show
no difference, job files as key lines, and the pictures (speed-up and MFU per rung, compile's pay-back) drawn."""
import ast
import json
import re
from pathlib import Path

import pytest

from tutorial_lib import reference
from tutorial_lib.lessons import evidence, ladder, ladder_plot, noise

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "04_mixed_precision.ipynb"
CARDS = sorted(p.stem for p in reference.FOLDER.glob("04_ladder_*.json"))  # each card's own ladder


def cells() -> list[dict]:
    return json.loads(NOTEBOOK.read_text())["cells"]


def outputs_text(cell: dict) -> str:
    out = []
    for o in cell.get("outputs", []):
        data = o.get("data", {})
        for text in (o.get("text"), data.get("text/markdown"), data.get("text/plain") if "image/png" not in data else None):
            if text:
                out.append("".join(text))
    return "\n".join(out)


def learner_text() -> str:
    """Markdown and printed output, in the order a learner meets them."""
    return "\n".join("".join(c["source"]) if c["cell_type"] == "markdown" else outputs_text(c) for c in cells())


def ref_rows(name: str) -> list[dict]:
    return reference.load(name)["figures"]["rows"]


# ------------------------------------------------------------------------------------------------ jargon
# term -> the words that introduce it; no use of the term may come before them
INTRODUCED = {
    "Dynamo": "*Dynamo* traces the Python code into a graph",
    "AOTAutograd": "*AOTAutograd* derives the backward graph",
    "Inductor": "*Inductor* generates fused kernels",
    "guard": "Dynamo's *guards* check at every call",
    "meta device": "PyTorch's *meta device* (tensors with a shape but no data)",
    "graph break": "causes a *graph break*",
    "launch-bound": "the eager step is *launch-bound*: the GPU waits",
}


@pytest.mark.parametrize("term", INTRODUCED)
def test_jargon_is_introduced_before_it_is_used(term):
    text = " ".join(learner_text().split())
    said = " ".join(INTRODUCED[term].split())
    assert said in text, f"04 no longer introduces {term!r} with {said!r}: introduce it before its first use"
    first = re.search(rf"(?i)\b{re.escape(term)}", text)
    assert first.start() >= text.index(said), (
        f"04 uses {term!r} before it introduces it: {text[max(0, first.start() - 80):first.start() + 40]!r}")


# ------------------------------------------------------------------------------------------------ history
HISTORY = re.compile(r"(?i)\bof that day\b|\bdid not yet\b|\bno longer\b|\bused to (be|print|say)\b|\bat the time\b"
                     r"|\b(old|earlier|previous|former) (bench|rule|workbook|version|record)s?\b|\buntil (recently|now)\b")


def test_the_history_pattern_finds_the_workbooks_own_history():
    assert HISTORY.search("the bench of that day did not yet print every band as at least ±5%")
    assert HISTORY.search("judged by the old rule") and not HISTORY.search("the last rung's mean step")


def _strings(path: Path) -> list[str]:
    """The string literals of a module (f-strings' text included), docstrings left out: what it can print."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef))
            and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs]


@pytest.mark.parametrize("module", ["ladder", "ladder_plot", "roofline", "warm", "evidence"])
def test_no_line_the_lessons_print_is_the_workbooks_history(module):
    found = [s for s in _strings(ROOT / "tutorial_lib" / "lessons" / f"{module}.py") if HISTORY.search(s)]
    assert not found, f"lessons/{module}.py prints the workbook's own history: {found}"


def test_notebook_04_prints_no_history():
    found = [m.group(0) for m in HISTORY.finditer(learner_text())]
    assert not found, f"04's markdown or outputs speak of the workbook's history: {found}"


# ------------------------------------------------------------------------------------------------ premises
PREMISE = re.compile(r"([^.?]*?)\bis (faster|slower)\b[^.?]*?\bthan\b([^.?]*)\.")


def questions() -> list[str]:
    text = "\n".join("".join(c["source"]) for c in cells() if c["cell_type"] == "markdown")
    asked = text.split("## Questions", 1)[1].split("<details>", 1)[0]
    return [" ".join(q.split()) for q in re.split(r"\n\s*\d+\. ", "\n" + asked)[1:]]


def side(words: str, named: list[str]) -> str:
    """The rung a side of a premise means: a rung it names, or 'batch N' (the GPU ladder's batch of a named rung)."""
    plan = {rung.name: cfg.batch_size for rung, cfg, _ in ladder.configs(ladder.GPU)}
    direct = [n for n in named if n in words]
    batch = re.search(r"(?i)\bbatch (\d+)", words)
    by_batch = [n for n in named if batch and plan[n] == int(batch.group(1))]
    got = direct or by_batch
    assert len(got) == 1, f"the premise side {words.strip()!r} names no one row of {named} (name the rows it means)"
    return got[0]


def cpu_verdict(a: str, b: str) -> str:
    """'higher'/'lower'/... of row a against row b in the committed CPU table (the row-it-changes column)."""
    text = next(outputs_text(c) for c in cells() if c["cell_type"] == "code" and "tl.ladder.run(" in "".join(c["source"]))
    here = text.split("**Reference**")[0]
    for row, other, flip in ((a, b, False), (b, a, True)):
        m = re.search(rf"^\| {row} \|.*?, (faster|slower|within noise|not settled)[^|]*?\b{other}\b", here, re.M)
        if m:
            v = {"faster": "higher", "slower": "lower", "within noise": "equal"}.get(m.group(1), "not settled")
            return {"higher": "lower", "lower": "higher"}.get(v, v) if flip else v
    raise AssertionError(f"the committed CPU table holds no verdict between {a} and {b}")


def test_every_question_premise_agrees_with_the_figures_it_points_at():
    """A question that states which of two rows is faster names the rows; the reference runs of every card and
    the committed CPU outputs agree with it (by the rule: the one side faster than the other)."""
    rungs = [r.name for r in ladder.rungs(ladder.GPU)]
    checked = 0
    for q in questions():
        for m in PREMISE.finditer(q):
            named = [n for n in re.findall(r"`(\w+)`", q) if n in rungs]
            assert len(named) >= 2, f"the question {q[:90]!r} states {m.group(0)!r} but names no rows it compares"
            a, b = side(m.group(1), named), side(m.group(3), named)
            want = "higher" if m.group(2) == "faster" else "lower"
            for card in CARDS:
                rows = ref_rows(card)
                got = {r["rung"]: r for r in rows if not r["skipped"]}
                verdict = noise.compare(ladder.figure(got[a]), ladder.figure(got[b])).verdict
                assert verdict == want, f"{card}: {a} against {b} is {verdict}, the question says {m.group(0)!r}"
            assert cpu_verdict(a, b) == want, f"CPU outputs: {a} against {b} disagree with {m.group(0)!r}"
            checked += 1
    assert checked, "no question states a direction: the premise check found nothing to check (reworded?)"


def test_a_premise_that_names_no_rows_fails():
    with pytest.raises(AssertionError, match="names no one row"):
        side("Batch 1024", ["bf16", "fp32"])


# ------------------------------------------------------------------------------------------------ prose vs figures
@pytest.mark.parametrize("card", CARDS)
def test_the_trace_sentence_agrees_with_each_card(card):
    """'In the eager step most of the time is idle ... In the CUDA-graph steps compute takes nearly all of it'."""
    assert "In the eager step most of the time is **idle**" in learner_text()
    t = reference.load(card)["figures"]["traces"]
    assert t["channels_last"]["shares"]["idle"] > 0.5
    assert all(t[k]["shares"]["compute"] > 0.85 for k in ("gpu_resident", "last_small_batch"))


@pytest.mark.parametrize("card", CARDS)
def test_the_mfu_question_and_the_big_batch_answer_agree_with_each_card(card):
    """Q3: the fp32 row has the highest MFU of the eager rungs and the lowest throughput; A4: big_batch waits for
    data (its mean wait above half its median step)."""
    got = {r["rung"]: r for r in ref_rows(card) if not r["skipped"]}
    eager = [got[k] for k in ("fp32", "tf32", "bf16", "channels_last", "fused_adamw")]
    assert max(eager, key=lambda r: r["mfu"])["rung"] == "fp32" == min(eager, key=lambda r: r["img_s"])["rung"]
    assert got["big_batch"]["data_wait_ms"] > 0.5 * got["big_batch"]["step_ms"]


def test_gpu_figures_name_the_card_and_torch():
    """Every output that names a reference card names the torch it ran with."""
    for c in cells():
        text = outputs_text(c)
        if re.search(r"\bH(100|200)\b", text):
            assert "torch 2.11" in text, f"an output names a card without its torch: {text[:120]!r}"


# ------------------------------------------------------------------------------------------------ columns, jobs
def test_no_table_shows_a_loss_that_can_show_no_difference():
    """The ladder's loss after its steps is about 0 in every GPU row: the notebook's tables leave it out (the
    precision check judges learning instead)."""
    assert "loss after steps" not in ladder.table(ref_rows("04_ladder_h200"))
    assert "loss after steps" not in learner_text()
    assert "against fp32" in learner_text()  # the precision check's verdicts


def test_job_files_are_shown_as_key_lines():
    job = [c for c in cells() if c["cell_type"] == "code" and "tl.jobs.write(" in "".join(c["source"])]
    assert job, "04 no longer writes its job"
    text = outputs_text(job[0])
    assert "jobs/04_ladder.sbatch" in text and "asks for" in text and text.count("#SBATCH") == 0


# ------------------------------------------------------------------------------------------------ pictures
PICTURES = ["tl.ladder_plot.bars(", "tl.ladder_plot.payback("]


@pytest.mark.parametrize("call", PICTURES)
def test_each_picture_is_in_the_committed_outputs(call):
    drawing = [c for c in cells() if c["cell_type"] == "code" and call in "".join(c["source"])]
    assert drawing, f"04: no cell calls {call!r}"
    assert any("image/png" in o.get("data", {}) for c in drawing for o in c.get("outputs", [])), (
        f"04: the cell calling {call!r} has no picture in its committed outputs: execute the notebook again")


def test_the_mfu_bars_name_the_peak_each_is_against():
    import matplotlib

    matplotlib.use("Agg")
    cpu = [{"rung": "fp32", "skipped": None, "img_s": 200.0, "speedup": 1.0, "mfu": None, "device": "CPU (x)"}]
    fig, left, right = ladder_plot.draw_bars([("here: CPU (x)", cpu), ("reference: NVIDIA H200, torch 2.11",
                                                                        ref_rows("04_ladder_h200"))])
    said = [t.get_text() for t in right.get_legend().get_texts()]
    assert any("fp32, of its dense peak 67.0 TFLOP/s" in s for s in said)
    assert any("bf16, of its dense peak 989.5 TFLOP/s" in s for s in said)
    assert any("here: CPU (x): no datasheet peak" in s for s in said)
    assert "torch 2.11" in " ".join(t.get_text() for t in left.get_legend().get_texts())
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_the_payback_lines_start_at_the_compile_time_and_agree_with_the_printed_steps():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = ref_rows("04_ladder_h200")
    points = ladder_plot.payback_points(rows)
    fig, ax = plt.subplots()
    ladder_plot.payback_axes(ax, "reference", points)
    lines = [line for line in ax.get_lines() if len(line.get_xdata()) > 1]
    assert lines[0].get_ydata()[0] == 0  # eager from zero
    assert [line.get_ydata()[0] for line in lines[1:]] == [p["compile_s"] for p in points]
    printed = evidence.payback_lines(rows, compiled=tuple(p["rung"] for p in points))
    for p, line in zip(points, printed):
        assert (f"pays back after {p['steps']:,.0f} steps" in line) == (p["steps"] is not None), line
    plt.close(fig)
    assert ladder_plot.payback_points(rows[:5]) == []  # no compiled rung: nothing to draw


def test_the_reference_shown_is_the_cards_own_else_the_reference_cards():
    assert ladder.shown_reference("04_ladder", "CPU (AMD EPYC, 2 threads)", default="04_ladder_h200") == "04_ladder_h200"
    assert ladder.shown_reference("04_ladder", "NVIDIA H100 80GB HBM3", default="04_ladder_h200") == "04_ladder_h100"
    assert ladder.shown_reference("04_ladder", "NVIDIA A100-SXM4-40GB", default="04_ladder_h200") == "04_ladder_h200"
    assert ladder.shown_reference("04_ladder", "CPU", default="04_ladder_none") == "04_ladder"  # no such file
