"""Notebook 06 as a room meets it: a one-GPU server still sees scaling (the reference curves beside its own points,
its live sweep on CPU processes), strong scaling's fall taken apart from its own figures, a headline that names
both sides and puts the wait first, the race's wall time as a picture, one baseline measurement, a ledger shown by
the columns that teach; and the sentences beside them agree with the reference figures."""
import json
import re
import sys
from pathlib import Path

import pytest

from tutorial_lib import reference
from tutorial_lib.config import UserError
from tutorial_lib.lessons import scaling, scaling_live, scaling_plot, scaling_study
from tutorial_lib.lessons.size import Size

ROOT = Path(__file__).resolve().parents[1]
NB = ROOT / "notebooks" / "06_scaling.ipynb"
sys.path.insert(0, str(ROOT / "tests"))
import test_readability as readability  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts"))
import instructor_figures as plan  # noqa: E402

sys.path.remove(str(ROOT / "scripts"))
FULL = Size(False, "test")


@pytest.fixture(scope="module")
def fig():
    return reference.load("06_scaling")["figures"]


def _cells():
    return json.loads(NB.read_text())["cells"]


def _cell(call: str) -> dict:
    found = [c for c in _cells() if c["cell_type"] == "code" and call in "".join(c["source"])]
    assert found, f"no cell of 06 calls {call!r}"
    return found[0]


def _printed(cell: dict) -> str:
    return readability.printed(cell)


def _has_picture(cell: dict) -> bool:
    return any("image/png" in o.get("data", {}) for o in cell.get("outputs", []))


# ---------------------------------------------------------------------------------------- a one-GPU room
def test_fewer_than_two_gpus_run_the_live_sweep_on_cpu_processes():
    """The parameters cell turns 'no two GPUs' into CPU processes, never into 'nothing ran': the CPU recipe is
    gloo's (device cpu, eager, fp32) whatever the size, and no cell skips its sweep on one GPU."""
    params = "".join(_cell("gpus_for(")["source"])
    assert "ON_CPU = not N" in params and "N = N or 2" in params and "live_recipe(S, cpu=ON_CPU)" in params
    cpu = scaling_live.live_recipe(FULL, cpu=True)
    assert (cpu.device, cpu.compile, cpu.cuda_graph, cpu.precision) == ("cpu", False, False, "fp32")
    assert cpu.steps <= 8 and cpu.batch_size == 16
    gpu = scaling_live.live_recipe(FULL, cpu=False)
    assert gpu.device != "cpu" and gpu.compile and gpu.batch_size == 1024
    said = " ".join(_printed(c) for c in _cells() if c["cell_type"] == "code")
    assert "nothing to plot" not in said and "section 8 (the reference run)" not in said


def test_the_reference_curves_stand_beside_this_servers_points(fig):
    """Left: the reference weak and strong curves and the ideal line, with this server's one GPU as a star;
    right, on their own axes: the live points, labelled as CPU processes. In the committed outputs too."""
    import matplotlib

    matplotlib.use("Agg")
    base = {"device": "cpu", "world_size": 1, "global_batch": 16, "throughput_img_s": 100.0,
            "config": {"parallel": "none"}}
    two = {**base, "world_size": 2, "global_batch": 32, "throughput_img_s": 150.0, "config": {"parallel": "ddp"}}
    weak = [scaling.efficiency(r, base) for r in (base, two)]
    gpu = {"device": "NVIDIA H200", "throughput_img_s": 80_000.0}
    f = scaling_plot.curves(fig, weak, [weak[0]], "CPU processes (gloo, tiny sizes)", gpu, "reference")
    left, right = f.axes
    labels = [line.get_label() for line in left.get_lines()]
    assert any(x.startswith("ideal") for x in labels) and any(x.startswith("weak") for x in labels)
    assert any(x.startswith("strong") for x in labels) and any("your GPU" in x for x in labels)
    assert "CPU processes" in right.get_title() and any(x.startswith("ideal") for x in
                                                         [line.get_label() for line in right.get_lines()])
    assert _has_picture(_cell("tl.scaling_plot.curves("))


# ---------------------------------------------------------------------------------------- strong scaling's fall
def test_strong_scalings_fall_is_taken_apart_from_the_notebooks_own_figures(fig):
    """0.666 = (one GPU at 256 / one GPU at 1024) x (4 GPUs at 256 / 4 x one GPU at 256), computed; both factors
    'slower' by the rule, as section 3's prose says (a smaller batch, and DDP), and the cell prints them."""
    s = scaling_live.strong_split(fig)
    runs = fig["runs"]
    assert s["efficiency"] == pytest.approx(s["batch"] * s["ddp"], rel=1e-9)
    assert s["batch"] == pytest.approx(runs["race_1"]["result"]["throughput_img_s"]
                                       / runs["weak_1"]["result"]["throughput_img_s"])
    assert s["batch_verdict"].endswith("slower") and s["ddp_verdict"].endswith("slower")
    out = _printed(_cell("strong_split_lines("))
    assert f"{s['efficiency']:.3f} = {s['batch']:.3f}" in out and f"x {s['ddp']:.3f} (DDP)" in out
    prose = next("".join(c["source"]) for c in _cells() if "Why strong scaling falls" in "".join(c["source"]))
    assert "smaller batch" in prose and "all-reduce" in prose


# ---------------------------------------------------------------------------------------- the headline, as a class
SIDE = re.compile(r"\d+ GPUs? at \d+ per GPU")


def headline_problems(line: str) -> list[str]:
    """A headline compares two configurations: both sides named (GPUs and batch per GPU), and what a person waits
    before the training alone (never in parentheses after it)."""
    out = []
    if len(SIDE.findall(line)) < 2:
        out.append("its two sides are not both named (N GPUs at B per GPU)")
    wait, train = line.find("wait"), line.find("training")
    if wait < 0:
        out.append("no waiting figure")
    elif 0 <= train < wait:
        out.append("the waiting figure comes after the training one")
    return out


def test_the_headline_rule_catches_the_old_headline():
    old = ("time to the target: 1 GPU 61.9 s of training -> 4 GPUs, 1024 per GPU, lr rule sqrt 13.4 s: 4.61x "
           "sooner (1.20x counting the fixed costs)")
    assert len(headline_problems(old)) == 2


def test_every_headline_names_both_sides_and_puts_the_wait_first(fig):
    lines = [x for x in scaling_live.race_headline(fig) if x.startswith("to ")]
    assert len(lines) == 2  # like with like (256 per GPU on both sides), then the other batch per GPU
    for line in lines:
        assert not headline_problems(line), (line, headline_problems(line))
    assert "1 GPU at 256 per GPU" in lines[0] and "4 GPUs at 256 per GPU" in lines[0]
    committed = [x for x in _printed(_cell("race_headline(")).splitlines() if x.startswith("to ")]
    assert committed == lines


# ---------------------------------------------------------------------------------------- the race's wall time
def test_the_race_wall_time_is_stacked_bars_that_add_up_to_the_wait(fig):
    import matplotlib

    matplotlib.use("Agg")
    rows = [r for r in scaling_study.race_rows(fig) if r.get("wait_s")]
    ax = scaling_plot.wait_bars(rows)
    widths = [p.get_width() for p in ax.patches]
    per_row = [sum(widths[i::len(rows)]) for i in range(len(rows))]
    assert per_row == pytest.approx([r["wait_s"] for r in rows], rel=1e-6)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [name for _, name in scaling_plot.PARTS]
    assert _has_picture(_cell("wait_bars("))


def test_the_question_on_waiting_agrees_with_the_reference_race(fig):
    """Question 3: 4 GPUs train more than three times sooner, the wait shrinks by less than half, and start-up
    alone is longer on 4 GPUs (its answer)."""
    text = " ".join(" ".join("".join(c["source"]) for c in _cells() if c["cell_type"] == "markdown").split())
    assert "more than three times sooner" in text and "shrinks by less than half" in text
    rows = [r for r in scaling_study.race_rows(fig) if r.get("wait_s")]
    one, many = rows[0], rows[1:]
    assert all(r["sooner"] > 3 for r in many) and all(r["sooner_waiting"] < 2 for r in many)
    assert all(r["start_s"] > one["start_s"] for r in many)


# ---------------------------------------------------------------------------------------- one baseline measurement
def test_notebook_01s_baseline_is_the_studys_own_configuration(fig):
    """The cell runs tl.scaling_study.baseline_recipe, the study's baseline stage: the same measurement on a GPU."""
    assert "tl.scaling_study.baseline_recipe(S" in "".join(_cell("decompose(")["source"])
    recorded = fig["runs"]["baseline"]["result"]["config"]
    cfg = scaling_study.baseline_recipe(FULL)
    for key in (*scaling.HELD_FIXED, "batch_size", "steps", "timing_warmup"):
        if key != "train_size":
            assert getattr(cfg, key) == recorded[key], key
    assert scaling_study.baseline_recipe(FULL, cpu=True).device == "cpu"


def test_a_slower_baseline_here_is_explained_by_its_wait_for_data(fig):
    ref = fig["runs"]["baseline"]["result"]
    step = 1000 * 256 / 7548  # 7,548 img/s waiting 16% of its step, on the reference's card
    here = {**ref, "throughput_img_s": 7548.0, "data_wait_ms": 0.16 * step}
    line = scaling_live.baseline_beside(here, fig)
    assert "waiting 16%" in line and line.endswith("within noise")
    assert scaling_live.baseline_beside({**here, "device": "cpu"}, fig) is None


# ---------------------------------------------------------------------------------------- the ledger
def test_the_ledger_shows_the_columns_that_teach_and_keeps_all_in_its_file(tmp_path):
    row = {"run": "a", "device": "cpu", "world_size": 2, "global_batch": 32, "throughput_img_s": 150.0,
           "step_time_ms": {"median": 213.0}, "val_accuracy": None, "steps": 8, "wall_time_s": 2.0,
           "config": {"out_dir": "a", "precision": "fp32", "lr": 0.002, "warmup_steps": 0}}
    shown = scaling.markdown_table([row], columns=scaling.SHOWN_COLUMNS).splitlines()[0]
    assert shown.count("|") == len(scaling.SHOWN_COLUMNS) + 1 <= 8
    path = scaling.write_csv([row], tmp_path / "runs.csv")
    assert path.read_text().splitlines()[0].split(",") == list(scaling.LEDGER_COLUMNS)
    with pytest.raises(UserError, match="not ledger columns"):
        scaling.markdown_table([row], columns=("run", "speed"))
    cell = _cell("tl.scaling.write_csv(")
    table = next(line for line in _printed(cell).splitlines() if line.startswith("| run"))
    assert table.count("|") <= 8


# ---------------------------------------------------------------------------------------- the room's pace
def test_06_reads_at_the_workshops_pace_and_fits_its_share_of_the_day():
    """06's share of the first day: 05-07 about 38 min each, so that 00-07's core path fits the day's 330."""
    m = readability.measure(json.loads(NB.read_text()))
    assert not readability.problems(m), readability.problems(m)
    assert plan.minutes("06_scaling")["core"] <= 38
