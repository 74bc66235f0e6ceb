"""Notebook 07 as a learner meets it: the card as a picture (lessons/card_plot.py) in the committed outputs, the
five-line verdict instead of the whole page, a comparison of two batches that compares like with like and names
both sides, the job shown as its key lines, and the notebook at the workshop's pace (words, sentences, minutes)."""
import copy
import importlib.util
import json
import re
import sys
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

from tutorial_lib import peaks  # noqa: E402
from tutorial_lib.config import UserError  # noqa: E402
from tutorial_lib.lessons import card_plot, ladder, noise  # noqa: E402
from tutorial_lib.lessons.card_report import Card  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "07_your_own_model.ipynb"
CARDS = sorted((ROOT / "notebooks" / "reference" / "cards").glob("card_*.json"))
CORE_MINUTES = 38  # the workshop's pace for 07's core path, by the time model
LABELS = ("What bounds it", "Recommended", "MFU", "Memory", "DDP")  # the verdict's five lines (card_verdict.lines)


@pytest.fixture(autouse=True)
def _no_window(monkeypatch):
    import matplotlib.pyplot as plt

    monkeypatch.setattr(plt, "show", lambda *a, **k: None)
    yield
    plt.close("all")


def cells() -> list[dict]:
    return json.loads(NOTEBOOK.read_text())["cells"]


def code_cells(call: str) -> list[dict]:
    return [c for c in cells() if c["cell_type"] == "code" and call in "".join(c["source"])]


def printed(cell: dict) -> str:
    out = []
    for o in cell.get("outputs", []):
        data = o.get("data", {})
        if "image/png" not in data:
            out.append("".join(o.get("text") or data.get("text/markdown") or data.get("text/plain") or ""))
    return "\n".join(out)


def record(name: str = "gpt") -> dict:
    return json.loads((ROOT / "notebooks" / "reference" / "cards" / f"card_{name}.json").read_text())


def scaled(row: dict, factor: float) -> dict:
    """`row` measured `factor` times as fast: its rate up, its steps down."""
    out = {**row, "img_s": row["img_s"] * factor}
    for k in ("step_ms", "step_ms_p10", "step_ms_p90"):
        out[k] = row[k] / factor
    if row.get("step_ms_blocks"):
        out["step_ms_blocks"] = [b / factor for b in row["step_ms_blocks"]]
    return out


# ---------------------------------------------------------------------------------------- the picture
@pytest.mark.parametrize("path", CARDS, ids=lambda p: p.stem)
def test_the_picture_of_each_reference_card_names_its_card_torch_and_peak(path):
    """On CPU, from the committed reference cards: one bar per measured rung, MFU against the card's bf16 dense
    peak (named on the axis), the title naming the card and the torch version it was measured with."""
    card = card_plot.as_card(path)
    fig = card_plot.plot(path)
    left, right = fig.axes
    measured = [r for r in card.rows if not r["skipped"]]
    assert len(left.patches) == len(measured)
    title = fig._suptitle.get_text()
    assert card.device in title and f"torch {card.torch_version}" in title
    bf16 = peaks.dense_peaks(card.device)["bf16"]
    assert f"{bf16:,.1f} TFLOP/s" in right.get_xlabel() and "bf16" in right.get_xlabel()
    for bar, b in zip(right.patches, card_plot.bars(card)):  # every rung over the one peak, so that rungs compare
        r = next(x for x in card.rows if x["rung"] == b["rung"])
        assert bar.get_width() == pytest.approx(100 * r["img_s"] * card.probe["flops_per_sample"] / (bf16 * 1e12))


def test_an_input_capped_rung_is_hatched_with_the_model_alone_beside_it():
    rec = record()
    row = next(r for r in rec["rows"] if r["rung"] == "bf16")
    row["data_wait_ms"] = 0.5 * row["step_ms"]
    row["resident"] = {k: v for k, v in scaled(row, 2.0).items() if k in ("img_s", "step_ms", "step_ms_p10",
                                                                            "step_ms_p90", "steps", "batch")}
    got = {b["rung"]: b for b in card_plot.bars(rec)}
    assert got["bf16"]["cap"] == "input" and got["bf16"]["alone_img_s"] == pytest.approx(2 * row["img_s"])
    assert got["fp32"]["cap"] == "model" and got["fp32"]["alone_img_s"] is None
    left = card_plot.plot(rec).axes[0]
    assert sum(p.get_hatch() == "//" for p in left.patches) == 1
    assert "your batches cap" in left.get_legend().get_title().get_text()


def test_a_cpu_card_draws_its_rungs_and_says_mfu_is_na():
    rec = copy.deepcopy(record())
    rec["device"] = "CPU (AMD EPYC, 2 threads)"
    fig = card_plot.plot(rec)
    assert fig.axes[0].patches and not fig.axes[1].patches
    assert "MFU n/a" in " ".join(t.get_text() for t in fig.axes[1].texts)


def test_bad_input_is_one_line():
    with pytest.raises(UserError, match="no such card.json"):
        card_plot.as_card("runs/no_such_card/card.json")
    with pytest.raises(UserError, match="give a Card"):
        card_plot.as_card(42)


def test_the_card_cells_show_the_verdict_and_the_picture_in_the_committed_outputs():
    """Each card made in 07 (the transformer's and the learner's own, live) is shown as its five-line verdict,
    its picture (rendered on CPU, committed) and the path of its whole page, not as the page itself."""
    shown = code_cells("tl.card_plot.show(")
    assert len(shown) >= 2
    assert any("tl.card(MY_MODEL" in "".join(c["source"]) for c in shown), "the learner's own card must run live"
    for c in shown:
        assert any("image/png" in o.get("data", {}) for o in c.get("outputs", [])), "no picture: execute 07 again"
        text = printed(c)
        assert all(f"**{label}**" in text for label in LABELS), text
        assert re.search(r"`runs/card_\w+/card\.md`", text)
        assert "| rung |" not in text, "the whole rung table is on the page, not in the notebook"


def test_shown_figures_name_the_device_and_the_torch_they_were_measured_with():
    for c in code_cells("tl.card_plot.show("):
        head = printed(c).splitlines()[0]
        assert re.search(r" on .+, torch \d+\.\d+", head), head


def test_show_gives_the_path_of_the_cards_own_page_and_never_overwrites_another(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda x: shown.append(x.data))
    card = Card(**record())
    card_plot.show(card)  # no page yet (its job's folder is not here): written to tl.card's default folder
    page = tmp_path / "runs" / "card_gpt" / "card.md"
    assert page.read_text() == card.markdown() + "\n" and "`runs/card_gpt/card.md`" in shown[-1]
    assert all(f"**{label}**" in shown[-1] for label in LABELS) and "| rung |" not in shown[-1]
    assert "see below" not in shown[-1]  # nothing is below it in a notebook: the page names the peaks
    assert card_plot.page_path(card) == Path("runs/card_gpt/card.md")  # its own page: found again
    other = Card(**{**record(), "wall_s": 1.0})
    with pytest.raises(UserError, match="the page of another card; give folder="):
        card_plot.page_path(other)
    assert card_plot.page_path(other, "runs/other") == Path("runs/other/card.md")


# ---------------------------------------------------------------------------------------- like with like
def _two_batches(factor: float = 1.3):
    """The reference GPT card, and the same card at twice the batch `factor` times as fast; the first card's
    recommended row measured as recommended, slower than its ladder row (a configuration of its own)."""
    a, b = copy.deepcopy(record()), copy.deepcopy(record())
    a["recommended"]["row"] = {**scaled(a["recommended"]["row"], 0.7), "measured_as_recommended": True}
    b["probe"]["batch"] *= 2
    b["rows"] = [r if r["skipped"] else {**scaled(r, factor), "batch": 2 * r["batch"]} for r in b["rows"]]
    return Card(**a), Card(**b)


def test_versus_compares_the_same_rung_of_both_cards_and_names_both_sides():
    a, b = _two_batches()
    line = card_plot.versus(a, b, "step_graph", "sequences")
    first = next(r for r in a.rows if r["rung"] == "step_graph")
    second = next(r for r in b.rows if r["rung"] == "step_graph")
    assert line.startswith(f"step_graph at batch {first['batch']}: {first['img_s']:,.1f}")
    assert f"at batch {second['batch']}: {second['img_s']:,.1f}" in line
    assert f"{a.recommended['row']['img_s']:,.1f}" not in line  # not the recommendation's own configuration
    said = noise.compare(ladder.figure(second), ladder.figure(first))
    assert line.endswith(f"{said}, {said.words()}") and said.words() == "faster"


def test_versus_refuses_a_rung_one_card_did_not_measure():
    a, b = _two_batches()
    assert "not compared" in card_plot.versus(a, b, "channels_last") and "was not measured" in \
        card_plot.versus(a, b, "channels_last")


def test_the_notebooks_doubled_batch_compares_like_with_like():
    """Section 4 compares each rung with itself at the other batch (the ladder's rows of both cards), both
    batches named, judged by the rule; never the first card's recommended row against the second's rung."""
    cell = code_cells("runs/card_gpt_batch2x")
    assert len(cell) == 1
    source = "".join(cell[0]["source"])
    assert "card_plot.versus(" in source and 'recommended["row"]' not in source
    lines = [x for x in printed(cell[0]).splitlines() if x.strip()]
    assert lines and lines[0].startswith("fp32 ")
    for line in lines:
        if line is not lines[0] and re.match(r"\w+: not compared: ", line):  # a rung the second card did not reach
            continue
        m = re.match(r"(\w+) at batch (\d+): .*; at batch (\d+): .*; batch (\d+) against batch (\d+): x\d", line)
        assert m, line
        assert m[2] != m[3] and (m[4], m[5]) == (m[3], m[2]), line
        assert re.search(r", (faster|slower|within noise|not settled)", line), line


# ---------------------------------------------------------------------------------------- the job, the pace
def test_the_job_is_shown_as_its_key_lines_and_its_path():
    everything = "\n".join(printed(c) for c in cells() if c["cell_type"] == "code")
    assert len(re.findall(r"^#SBATCH", everything, re.M)) == 0 and "#!/bin/bash" not in everything
    job = code_cells("tl.jobkeys.key_lines(")
    assert len(job) == 1
    assert re.search(r"^  submit    sbatch runs/card_\w+/card_\w+\.sbatch", printed(job[0]), re.M)


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_07_reads_at_the_workshops_pace():
    readability = _module("readability_07", ROOT / "tests" / "test_readability.py")
    m = readability.measure(json.loads(NOTEBOOK.read_text()))
    assert not readability.problems(m), readability.problems(m)
    assert m["plots"] >= 2


def test_07s_core_fits_its_minutes_and_its_header_says_them():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import instructor_figures as plan
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    got = plan.minutes(NOTEBOOK.stem)
    assert got["core"] <= CORE_MINUTES, got
    assert abs(plan.stated(NOTEBOOK.stem)[0] - got["core"]) <= 0.15 * got["core"] + 1, "write_headers(only=['07_...'])"


def test_mfu_is_said_what_it_is_before_it_is_used():
    """The first learner text that says MFU (markdown or a printed output, in the notebook's order) says what it is."""
    for c in cells():
        text = "".join(c["source"]) if c["cell_type"] == "markdown" else printed(c)
        if "MFU" in text:
            assert c["cell_type"] == "markdown" and "model FLOPs utilisation" in text, text[:200]
            return
    pytest.fail("07 never says MFU")


def test_a_damaged_card_json_given_to_the_plot_is_one_line(tmp_path):
    from tutorial_lib.config import UserError
    from tutorial_lib.lessons import card_plot

    path = tmp_path / "card.json"
    path.write_text('{"name": "gpt", "rows": [')  # cut short
    with pytest.raises(UserError) as e:
        card_plot.as_card(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value) and "run the card again" in str(e.value)
