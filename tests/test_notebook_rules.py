"""Rules every committed notebook keeps, read from its source (no execution): no GPU figure typed by hand,
an answer for every question, TensorBoard stopped by the notebook that starts it, Slurm submission opt-in."""
import json
import re
from pathlib import Path

import pytest

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
    typed = [s for kind, text in cells(notebook) if kind == "markdown" for s in typed_gpu_figures(text)]
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

    s = notebook.Session(device, gpus, small)
    assert notebook.gpus_for(s, need, "DDP", on_cpu=on_cpu, instead="the reference run shows it") == uses
    out = capsys.readouterr().out
    if banner:
        assert out.count("**") == 2 and banner in out and "the reference run shows it" in out
    else:
        assert out == ""
