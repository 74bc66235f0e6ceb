"""GPU figures shown in notebooks come from reference files a GPU run wrote, and are not older than the cells."""
import json
from pathlib import Path

import pytest

from tutorial_lib import reference
from tutorial_lib.config import UserError

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_reference_files_exist_and_match_the_cells_that_record_them(notebook):
    problems = reference.stale(notebook)
    assert not problems, "; ".join(problems) + " -> run scripts/gpu/notebooks.sh on a GPU node and commit the files"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_reference_a_notebook_shows_is_recorded_somewhere(notebook):
    text = notebook.read_text()
    for name in set(__import__("re").findall(r"reference\.show\(\s*\\\"([\w.-]+)\\\"", text)):
        assert reference.load(name) is not None, f"{notebook.name} shows reference {name!r}, which no run wrote"


def test_record_writes_nothing_without_the_gpu_runner(tmp_path, monkeypatch):
    monkeypatch.delenv(reference.ENV, raising=False)
    assert reference.record("x", a=1) == {"a": 1}
    assert not list(tmp_path.iterdir())


def test_stamp_and_stale_follow_the_recording_cells(tmp_path):
    nb = tmp_path / "nb.ipynb"
    cell = {"cell_type": "code", "source": "tl.reference.record(\"demo\", img_s=1.0)", "metadata": {}, "outputs": []}
    nb.write_text(json.dumps({"cells": [cell]}))
    assert reference.stale(nb, tmp_path) == ["nb.ipynb: no reference file demo.json"]
    reference.write("demo", {"img_s": 1.0}, script="t", card="NVIDIA H200", gpus=1, torch_version="2.11", folder=tmp_path)
    assert "changed after" in reference.stale(nb, tmp_path)[0]
    assert reference.stamp(nb, tmp_path) == ["demo"]
    assert reference.stale(nb, tmp_path) == []
    cell["source"] += "  # edited"
    nb.write_text(json.dumps({"cells": [cell]}))
    assert "changed after" in reference.stale(nb, tmp_path)[0]


def test_a_record_names_its_host_cpu(tmp_path):
    """Two H100 nodes ran notebook 03's launch-bound step at 32,749 and 23,347 img/s: the host is part of a
    record. Read from /proc/cpuinfo; None where there is none."""
    (tmp_path / "cpuinfo").write_text("processor\t: 0\nmodel name\t: AMD EPYC  9454 48-Core Processor\n")
    assert reference.host_cpu(tmp_path / "cpuinfo").startswith("AMD EPYC 9454 48-Core Processor, ")
    assert reference.host_cpu(tmp_path / "none") is None
    reference.write("demo", {"img_s": 1.0}, script="s", card="NVIDIA H100", gpus=1, torch_version="2.11",
                    folder=tmp_path)
    assert reference.load("demo", tmp_path)["host"] == reference.host_cpu()


def test_show_names_the_card_and_torch_and_refuses_unknown_keys(tmp_path, capsys):
    reference.write("demo", {"img_s": 8938.2}, script="s.sh", card="NVIDIA H200", gpus=4, torch_version="2.11.0",
                    folder=tmp_path)
    assert reference.show("demo", ["img_s"], folder=tmp_path, units="img/s") is None  # a cell shows it once
    out = capsys.readouterr().out
    assert "4x NVIDIA H200, torch 2.11.0" in out and out.count("8,938 img/s") == 1
    with pytest.raises(UserError, match="no figure 'nope'"):
        reference.show("demo", ["nope"], folder=tmp_path)
    assert reference.show("missing", folder=tmp_path) is None
    assert "no GPU reference run recorded yet" in capsys.readouterr().out


def first_cell(notebook: Path) -> str:
    return "".join(json.loads(notebook.read_text())["cells"][0]["source"])


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_first_cell_says_where_and_when_the_gpu_figures_were_verified(notebook):
    line = reference.banner(notebook)
    assert line in first_cell(notebook), (f"{notebook.name}: its first cell lacks the line {line!r}; "
                                          "run python scripts/instructor_figures.py to write it")


def test_every_reference_torch_other_than_the_locks_has_a_note():
    problems = reference.torch_problems(NOTEBOOKS)
    assert not problems, "; ".join(problems) + f" -> add the note to {reference.NOTES}"


def test_banner_groups_runs_by_card_in_one_line(tmp_path):
    nb = tmp_path / "04_demo.ipynb"
    nb.write_text(json.dumps({"cells": [{"cell_type": "code", "source": "tl.reference.show(\"other\")"}]}))
    lock, notes = tmp_path / "requirements.lock", tmp_path / "README.md"
    lock.write_text("torch==2.14.1\n")
    notes.write_text("- **2.11**: the GPU nodes carry\n  torch 2.11 only.\n")
    for name, card, date in (("04_demo", "NVIDIA H100", "2026-11-26"), ("04_demo_b", "NVIDIA H100", "2026-11-27"),
                             ("other", "NVIDIA H200", "2026-11-25")):
        reference.write(name, {"x": 1.0}, script="s", card=card, gpus=1, torch_version="2.11.0+cu130", folder=tmp_path)
        rec = json.loads((tmp_path / f"{name}.json").read_text())
        (tmp_path / f"{name}.json").write_text(json.dumps({**rec, "date": date}))
    text = reference.banner(nb, tmp_path, lock, notes)
    assert text == ("**GPU figures:** 1x NVIDIA H100, torch 2.11.0+cu130, 2026-11-26 to 2026-11-27; 1x NVIDIA H200, "
                    "torch 2.11.0+cu130, 2026-11-25 (the README says why this torch).")  # one line, the why once
    assert reference.torch_problems([nb], tmp_path, lock, notes) == []
    notes.write_text("")
    assert "04_demo.json was run with torch 2.11, the lock pins 2.14" in reference.torch_problems([nb], tmp_path, lock, notes)[0]
    lock.write_text("torch==2.11.3\n")
    assert reference.torch_problems([nb], tmp_path, lock, notes) == []


def test_the_readme_says_once_why_a_reference_torch_is_not_the_locks():
    """The first cells say only 'the README says why this torch'; the README holds the why of each note."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    for m, why in reference.torch_notes().items():
        assert " ".join(why.split()) in readme, f"README.md lacks why torch {m}: {why!r}"
