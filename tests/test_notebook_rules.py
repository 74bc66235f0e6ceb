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
