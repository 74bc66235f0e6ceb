"""Notebook 05 as a room meets it: a server with fewer than 2 GPUs still runs the workbook's DDP (on 2 CPU
processes, labelled so) beside the reference; the per-rank step is a picture; a question's premise agrees
with the figures it points at; each case-study table names its card; a run no faster than one GPU says so; job
files are shown as their key lines; and the core path fits its slot by the time model."""
import copy
import json
import re
import sys
from pathlib import Path

import pytest

from tutorial_lib import reference
from tutorial_lib.config import TrainConfig, UserError
from tutorial_lib.lessons import ddp_probe, dpddp, noise, scaling

ROOT = Path(__file__).resolve().parents[1]
NB = ROOT / "notebooks" / "05_dp_vs_ddp.ipynb"
REF = reference.load("05_dp_vs_ddp")
CORE_MINUTES = 38  # 05's core path: a workshop slot with room for the questions


def cells() -> list[dict]:
    return json.loads(NB.read_text())["cells"]


def source(cell: dict) -> str:
    return "".join(cell["source"])


def printed(cell: dict) -> str:
    out = []
    for o in cell.get("outputs", []):
        data = o.get("data", {})
        out.append("".join(o.get("text") or data.get("text/markdown") or data.get("text/plain") or ""))
    return "\n".join(out)


def calling(call: str) -> dict:
    found = [c for c in cells() if c["cell_type"] == "code" and call in source(c)]
    assert len(found) == 1, f"05: {len(found)} cells call {call!r}, expected one"
    return found[0]


def has_picture(cell: dict) -> bool:
    return any("image/png" in o.get("data", {}) for o in cell.get("outputs", []))


# ---------------------------------------------------------------------------------------- a one-GPU room
@pytest.mark.parametrize("gpus_here, nproc, expect", [(0, 0, "2 CPU processes (gloo)"), (0, 2, "2 CPU processes (gloo)"),
                                                      (1, 0, "2 CPU processes (gloo)"),
                                                      (2, 2, "2 GPUs (NCCL)"), (4, 4, "4 GPUs (NCCL)")])
def test_fewer_than_two_gpus_run_ddp_on_two_cpu_processes(monkeypatch, gpus_here, nproc, expect):
    """0 or 1 GPU (tl.notebook.gpus_for gives NPROC = 0 on one GPU): the DDP cells run 2 gloo processes on the CPU
    in the CPU's recipe, and say so; with the GPUs, the recipe as given."""
    import torch

    from tutorial_lib import notebook

    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus_here)
    s = notebook.Session(small=gpus_here == 0, why="test", device="cuda" if gpus_here else "cpu", gpus=gpus_here)
    if gpus_here == 1:
        assert notebook.gpus_for(s, 2, "DDP") == 0  # what the parameters cell sets NPROC to on one GPU
    cfg = TrainConfig(model="resnet18", batch_size=256, precision="bf16", channels_last=True, steps=300)
    got, ranks, words = dpddp.stand_in(cfg, nproc)
    assert words == expect and ranks == max(2, nproc)
    if "CPU" in words:
        assert (got.device, got.model, got.precision, got.batch_size, got.steps) == ("cpu", "resnet18_imagenet",
                                                                                    "fp32", 16, 8)
    else:
        assert got == cfg


def test_the_live_ddp_cells_run_on_every_server_and_name_their_processes():
    """Today's defect: on one GPU the launch and trace cells printed nothing behind `if NPROC:`. Now they run on
    every server; the committed CPU outputs show DDP on CPU processes, per-rank traces and collective counts."""
    live, traced = calling("tl.dpddp.live("), calling("tl.dpddp.traced_run(")
    for c in (live, traced):
        assert "if NPROC" not in source(c), "a DDP cell gated on GPUs prints nothing in a one-GPU room"
    assert re.search(r"DDP on 2 CPU processes \(gloo\) [\d,]+ img/s: [\d.]+x, efficiency [\d.]+", printed(live))
    out = printed(traced)
    for rank in ("rank0", "rank1"):
        assert re.search(rf"^{rank}, per step: allreduce_ of [\d,]+ x1", out, re.M), out
    assert "this server: the ranks differ most in" in out and "reference: the ranks differ most in" in out
    assert has_picture(traced)


def test_what_changes_on_gpus_is_said_once():
    said = [source(c) for c in cells() if c["cell_type"] == "markdown" and "On GPUs" in source(c)]
    assert len(said) == 1 and "NCCL" in said[0] and "overlaps" in said[0], said


def test_collectives_are_counted_per_rank_and_per_step(tmp_path):
    """The counts the cell prints: c10d calls of a trace, with the elements of the first tensor, per step."""
    import gzip

    events = [{"name": f"ProfilerStep#{i}", "cat": "user_annotation"} for i in (3, 4)]
    events += [{"name": "c10d::allreduce_", "cat": "cpu_op", "args": {"Input Dims": [[[1000, 2]]]}}] * 2
    events += [{"name": "c10d::allreduce_", "cat": "cpu_op", "args": {"Input Dims": [[[1]]]}}]
    folder = tmp_path / "tb" / "profile"
    folder.mkdir(parents=True)
    with gzip.open(folder / "rank0.123.pt.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    assert dpddp.collectives(tmp_path) == {"rank0": [("allreduce_", 1, 0.5), ("allreduce_", 2000, 1.0)]}
    assert dpddp.collective_lines(tmp_path) == ["rank0, per step: allreduce_ of 1 x0.5, allreduce_ of 2,000 x1"]


# ---------------------------------------------------------------------------------------- the per-rank picture
def test_the_per_rank_step_is_stacked_from_the_reference_and_the_live_run():
    """Stacked bars per rank (compute, all-reduce not hidden by compute, waiting), from the reference's traced
    case and a live run's parts; every part of trace_summary lands in exactly one stack, so a bar is the step."""
    import matplotlib

    matplotlib.use("Agg")
    from tutorial_lib.trace_summary import PARTS

    assert sorted(p for keys, _ in dpddp.STACK.values() for p in keys) == sorted(PARTS)
    about, ranks = dpddp.reference_parts(REF["figures"])
    assert about.startswith("DDP eager") and len(ranks) == REF["figures"]["gpus"]
    for worker, parts in ranks.items():
        assert sum(dpddp.stacked(parts).values()) == pytest.approx(sum(parts.values()))
    live = {"rank0": dict.fromkeys(PARTS, 1.0), "rank1": {**dict.fromkeys(PARTS, 1.0), "comm": 9.0}}
    fig = dpddp.rank_bars([(f"reference: {tl_where()}", ranks), ("this server: DDP on 2 CPU processes (gloo)", live)])
    titles = [ax.get_title() for ax in fig.axes]
    assert "NVIDIA H200" in titles[0] and "torch 2.11" in titles[0] and "CPU processes" in titles[1]
    assert [len(ax.patches) for ax in fig.axes] == [3 * len(ranks), 3 * 2]
    assert "waiting" in dpddp.spread_line(ranks) and "all-reduce" in dpddp.spread_line(live)
    with pytest.raises(UserError, match="no panel has ranks"):
        dpddp.rank_bars([("empty", {})])


def tl_where() -> str:
    return reference.where(REF)


def test_the_committed_per_rank_picture_names_the_card_and_torch():
    out = printed(calling("tl.dpddp.rank_bars("))
    src = source(calling("tl.dpddp.rank_bars("))
    assert "tl.reference.where(REF)" in src and "this server: DDP on {where}" in src
    assert has_picture(calling("tl.dpddp.rank_bars(")) and out


# ---------------------------------------------------------------------------------------- questions and figures
def _questions() -> list[str]:
    text = "\n".join(source(c) for c in cells() if c["cell_type"] == "markdown" and "## Questions" in source(c))
    text = re.sub(r"<details>.*?</details>", " ", text, flags=re.S)
    return [" ".join(q.split()) for q in re.split(r"\n(?=\d+\. )", text) if re.match(r"\d+\. ", q)]


def _dp_memory(figures: dict) -> list[tuple[list, list | None]]:
    """(DataParallel's MiB per GPU, eager DDP's on as many GPUs) for every DataParallel case at 256 per GPU."""
    cases = figures["cases"]
    out = []
    for name, rec in cases.items():
        if re.fullmatch(r"dp_\d+", name) and rec.get("monitor", {}).get("mem_used_mib"):
            ddp = cases.get(name.replace("dp_", "ddp_eager_"), {}).get("monitor", {}).get("mem_used_mib")
            out.append((rec["monitor"]["mem_used_mib"], ddp))
    return out


def _verdict(a: float, b: float) -> str:
    return noise.compare(noise.Figure.of(a), noise.Figure.of(b)).verdict


# A question that points at figures states a premise; each premise, by its words, and what it claims of them.
PREMISES = {
    "under DataParallel, GPU 0 holds more than any other GPU":
        lambda f: all(_verdict(dp[0], max(dp[1:])) == "higher" for dp, _ in _dp_memory(f)),
    "each GPU under eager DDP holds about as much as that GPU 0":
        lambda f: all(_verdict(max(ddp), dp[0]) == "equal" for dp, ddp in _dp_memory(f) if ddp),
    # the premise of today's question 2: GPU 0 under DataParallel runs out of memory first, i.e. before DDP's do
    "GPU 0 run out of memory first under DataParallel":
        lambda f: all(_verdict(dp[0], max(ddp)) == "higher" for dp, ddp in _dp_memory(f) if ddp),
}
POINTS_AT_FIGURES = re.compile(r"section \d|lines|table|holds|MiB|img/s|out of memory", re.I)


def test_every_question_that_points_at_figures_agrees_with_them():
    """The class: a question whose premise is a measured fact (it points at a section's lines or a figure) names
    a premise of PREMISES, and every premise it names holds on the reference record."""
    pointing = [q for q in _questions() if POINTS_AT_FIGURES.search(q)]
    assert pointing, "05's questions: none points at its figures (the memory question is gone?)"
    for q in pointing:
        named = [p for p in PREMISES if p.lower() in q.lower()]
        assert named, f"05 question {q[:60]!r}... points at figures but names no premise the test can check"
        for p in named:
            assert PREMISES[p](REF["figures"]), f"05 question {q[:60]!r}...: {p!r} does not hold on the reference"


def test_the_premise_check_refuses_todays_question_two():
    """Under DataParallel, GPU 0 holds no more than each DDP GPU: 'runs out of memory first' is false on the
    reference, and the check says so; the new premises hold and the committed memory lines print them."""
    assert _dp_memory(REF["figures"]) and not PREMISES["GPU 0 run out of memory first under DataParallel"](REF["figures"])
    out = printed(calling("tl.dpddp.memory_sides("))
    assert out.count("more than any other GPU") >= len(_dp_memory(REF["figures"]))
    assert "about as much as DataParallel's GPU 0" in out


def test_memory_sides_follows_the_rule_on_a_record_where_ddp_holds_more():
    f = copy.deepcopy(REF["figures"])
    f["cases"]["ddp_eager_2"]["monitor"]["mem_used_mib"] = [4000.0, 4000.0]
    said = "\n".join(dpddp.memory_sides(f))
    assert "at most 4,000 MiB per GPU, more than DataParallel's GPU 0" in said
    assert not PREMISES["each GPU under eager DDP holds about as much as that GPU 0"](f)


def test_the_largest_dataparallel_phase_is_the_one_the_text_names():
    """Section 1: 'Its largest phase is the parallel forward pass', on every DataParallel case recorded."""
    text = " ".join(source(c) for c in cells() if c["cell_type"] == "markdown")
    assert "largest phase is the parallel forward pass" in text
    for name in dpddp.dp_names(REF["figures"]):
        assert next(iter(dpddp.phases(REF["figures"], name)["phases_ms"])) == "dp parallel forward", name


# ---------------------------------------------------------------------------------------- one card per comparison
def test_each_case_study_table_names_its_card_and_says_when_it_is_not_section_fours():
    probe, gap = reference.load("05_ddp_probe"), reference.load("05_ddp_gap")
    assert ddp_probe.card_note(REF, REF) is None
    for rec in (probe, gap, reference.load("05_ddp_gap_before")):
        note = ddp_probe.card_note(rec, REF)
        assert (note is None) == (ddp_probe.card(rec) == ddp_probe.card(REF))
        if note:
            assert ddp_probe.card(rec) in note and ddp_probe.card(REF) in note and "another card" in note
    assert ddp_probe.card(probe) != ddp_probe.card(REF)  # the committed case study: 4x H100 against 4x H200
    for call in ('reference.load("05_ddp_probe")', '"05_ddp_gap"'):
        cell = calling(call)
        assert "card_note(" in source(cell)
        for rec in (probe,) if "probe" in call else (gap, reference.load("05_ddp_gap_before")):
            assert reference.where(rec) in printed(cell)
            note = ddp_probe.card_note(rec, REF)
            assert note is None or note in printed(cell)


# ---------------------------------------------------------------------------------------- no faster than one GPU
@pytest.mark.parametrize("vs_one, verdict, said", [
    ("≈", "below 4 x one GPU", "below 4 x one GPU, no faster than one GPU"),
    ("?", "below 4 x one GPU", "below 4 x one GPU, not shown faster than one GPU"),
    (">", "below 4 x one GPU, faster than one GPU", "below 4 x one GPU, faster than one GPU"),
    ("<", "slower than one GPU", "slower than one GPU")])
def test_a_run_no_faster_than_one_gpu_says_so(vs_one, verdict, said):
    assert dpddp.against_one({"verdict": verdict, "vs_one": vs_one}) == said


def test_every_row_says_where_it_stands_against_one_gpu():
    """The class of today's 'within noise of one GPU' beside an efficiency of 0.23: each row of 05's table says
    faster, slower, no faster or not shown faster than one GPU, as the rule judges the run against one GPU."""
    f = REF["figures"]
    for row in dpddp.rows(f):
        rec = f["cases"][row["case"]]
        one = next(c for c in f["cases"].values() if c.get("result") and c["about"] == row["baseline"])
        gpus = rec["gpus"] if rec["result"]["config"]["parallel"] == "dp" else row["gpus"]
        v = scaling.scaling_verdict(rec["result"], one["result"], gpus, rec.get("bench"), one.get("bench"))
        words = {">": "faster than one GPU", "<": "slower than one GPU", "≈": "no faster than one GPU",
                 "?": "not shown faster than one GPU"}[v["vs_one"]]
        assert words in row["verdict"] and "within noise of one GPU" not in row["verdict"], row
    dp_1024 = next(r for r in dpddp.rows(f) if r["case"] == "dp_4_b1024")
    assert dp_1024["efficiency"] < 0.5 and "faster than one GPU" in dp_1024["verdict"]
    assert dp_1024["verdict"].split(", ")[-1] in ("no faster than one GPU", "not shown faster than one GPU")


# ---------------------------------------------------------------------------------------- jobs, text and time
def test_job_files_are_shown_as_their_key_lines():
    for c in cells():
        out = printed(c)
        assert not re.search(r"^#SBATCH", out, re.M), f"05 prints a job file: {source(c)[:60]!r}"
    for name in ("05_ddp", "05_ddp_container"):
        out = "\n".join(printed(c) for c in cells())
        assert f"jobs/{name}.sbatch (" in out and f"submit    sbatch jobs/{name}.sbatch" in out


def test_the_core_path_fits_its_slot_and_reads_at_the_workshops_pace():
    sys.path.insert(0, str(ROOT / "scripts"))
    sys.path.insert(0, str(ROOT / "tests"))
    import instructor_figures
    import test_readability

    core = instructor_figures.minutes(NB.stem)["core"]
    assert core <= CORE_MINUTES, f"05's core path counts {core} min, over {CORE_MINUTES}"
    m = test_readability.measure(json.loads(NB.read_text()))
    assert not test_readability.problems(m), test_readability.problems(m)
    assert instructor_figures.stated(NB.stem)[0] == round(core)
    text = " ".join(source(c) for c in cells() if c["cell_type"] == "markdown")
    assert "bus bandwidth" not in test_readability.core_markdown(json.loads(NB.read_text()))
    assert "4x NVIDIA H100" not in source(cells()[0]) or "4x NVIDIA H200" in source(cells()[0])
    assert text.count("(optional)") >= 3  # the case study, the hang drill and the knobs stay out of the core
