"""Labels that mislead, as a class: units of 2**20-byte figures, step numbers as the profiler counts them, and an
answer for every exercise of a notebook."""
import json
import re
from pathlib import Path

import pytest

from tutorial_lib import trace_summary
from tutorial_lib.values import step_label

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# a formatted figure divided by 2**20, or one of the workbook's 2**20-byte fields, said in 'MB' (1e6 bytes)
BINARY_AS_MB = re.compile(r"\{[^{}]*(2 ?\*\* ?20|peak_memory_mb|memory_mb)[^{}]*\}[^\"'{]{0,3}MB\b")


def test_binary_figures_said_in_mb_are_found():
    assert BINARY_AS_MB.search('f"{r.peak_memory_mb:,.0f} MB"')
    assert BINARY_AS_MB.search('f"{size / 2**20:.1f} MB"')
    assert not BINARY_AS_MB.search('f"{r.peak_memory_mb:,.0f} MiB"')
    assert not BINARY_AS_MB.search('f"{trace.stat().st_size / 1e6:.1f} MB"')  # 1e6 bytes are MB


def _code() -> list[tuple[str, str]]:
    out = [(str(p.relative_to(ROOT)), p.read_text()) for p in sorted((ROOT / "tutorial_lib").rglob("*.py"))]
    for nb in NOTEBOOKS:
        cells = json.loads(nb.read_text())["cells"]
        out += [(f"{nb.name} cell {i}", "".join(c["source"])) for i, c in enumerate(cells) if c["cell_type"] == "code"]
    return out


def test_no_figure_of_2_20_bytes_is_said_in_mb():
    wrong = [f"{where}: {m.group(0)}" for where, text in _code() for m in BINARY_AS_MB.finditer(text)]
    assert not wrong, "2**20 bytes are MiB (MB is 1e6): " + "; ".join(wrong)


def test_the_traces_peak_memory_is_said_in_mib():
    t = trace_summary.TraceSummary.__new__(trace_summary.TraceSummary)
    t.peak_memory_mb = {"GPU 0": 1718.3}
    assert t.memory_line() == "peak memory allocated while profiling: GPU 0 1,718.3 MiB"


def test_step_labels_count_from_one_as_the_notebook_says():
    """02 printed 'steps 8-10 recorded' beside bars labelled #7-#9: the profiler counts steps from 0. With
    profile_wait=1 and profile_warmup=1 it records ProfilerStep#2 and #3 (tests/test_profiling.py), which the
    notebook's words call steps WAIT + WARMUP + 1 = 3 and 4."""
    wait, warmup, active = 1, 1, 2
    recorded = [f"ProfilerStep#{i}" for i in range(wait + warmup, wait + warmup + active)]
    assert [step_label(n) for n in recorded] == [f"step {wait + warmup + 1}", f"step {wait + warmup + active}"]
    assert step_label("other") == "other"


def exercises(notebook: Path) -> list[tuple[str, bool]]:
    """(exercise number, whether a collapsed answer follows it before the next exercise) for each exercise."""
    text = "\n".join("".join(c["source"]) for c in json.loads(notebook.read_text())["cells"]
                     if c["cell_type"] == "markdown")
    part = re.search(r"^## Exercises.*?(?=^## |\Z)", text, re.M | re.S)
    if not part:
        return []
    pieces = re.split(r"^\*\*(\d+)\.\*\*", part.group(0), flags=re.M)
    return [(pieces[i], "<details>" in pieces[i + 1]) for i in range(1, len(pieces) - 1, 2)]


def test_exercises_are_found_with_their_answers():
    nb = {"cells": [{"cell_type": "markdown", "source": "## Exercises (optional)\n**1.** a\n<details>x</details>\n"
                                                         "**2.** b\n\n## Summary\n<details>y</details>"}]}
    path = ROOT / "build" / "t_exercises.ipynb"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(nb))
    assert exercises(path) == [("1", True), ("2", False)]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_exercise_has_an_answer(notebook):
    missing = [n for n, answered in exercises(notebook) if not answered]
    assert not missing, f"{notebook.name}: exercises {missing} have no collapsed answer (<details>)"


def _markdown(stem: str) -> str:
    cells = json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text())["cells"]
    return " ".join(" ".join("".join(c["source"]).split()) for c in cells if c["cell_type"] == "markdown")


IMAGENET_DECODED_GB = 1_281_167 * 224 * 224 * 3 / 1e9  # its training images at 224x224x3 bytes: 192.9 GB
# (notebook, words that misled a learner, words that now stand in their place)
MISLEADING = [
    ("03_data_loading", "ImageNet is ~150 GB decoded", f"about {IMAGENET_DECODED_GB:.0f} GB decoded"),
    ("03_data_loading", "a fraction of a percent of a ResNet-18 step", "by a few percent at most"),
    ("03_data_loading", "within 5% of SYNTHETIC on your GPU", "With pinned memory and persistent workers"),
    ("03_data_loading", "its pages stay resident", "A real epoch reads new data every step"),
    ("02_profiling", "takes longer than the step itself", "even where one batch loads faster than one step"),
    ("02_profiling", "ranked by **self** time (the time spent", "its percentage columns add up to more than 100%"),
    ("02_profiling", "records every operator (with its", "torch.profiler does not sample"),
    ("02_profiling", "the lines' host times then follow the GPU's work", "mostly waits out the kernels backward"),
    ("01_single_gpu", "| throughput | `result.throughput_img_s`", "one update on one batch may lower the loss or raise it"),
    ("01_single_gpu", "make warm on a node of this GPU type", "notebook 04 explains it"),
]


@pytest.mark.parametrize("notebook,wrong,right", MISLEADING, ids=lambda x: x[:30] if isinstance(x, str) else x)
def test_what_misled_a_learner_is_gone_and_says_it_right(notebook, wrong, right):
    text = _markdown(notebook)
    assert wrong not in text, f"{notebook}: {wrong!r} misleads (see the words that replace it: {right!r})"
    assert right in text, f"{notebook}: {right!r} is gone; say again what it said, or update MISLEADING"


def test_notebook_01s_summary_prints_values():
    cells = json.loads((ROOT / "notebooks" / "01_single_gpu.ipynb").read_text())["cells"]
    at = next(i for i, c in enumerate(cells) if "".join(c["source"]).startswith("## Summary"))
    code = "".join(cells[at + 1]["source"])
    assert cells[at + 1]["cell_type"] == "code" and "result.throughput_img_s" in code and "MiB" in code
