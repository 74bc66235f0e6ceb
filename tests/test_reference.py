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


def test_show_names_the_card_and_torch_and_refuses_unknown_keys(tmp_path, capsys):
    reference.write("demo", {"img_s": 8938.2}, script="s.sh", card="NVIDIA H200", gpus=4, torch_version="2.11.0",
                    folder=tmp_path)
    assert reference.show("demo", ["img_s"], folder=tmp_path, units="img/s") == {"img_s": 8938.2}
    out = capsys.readouterr().out
    assert "4x NVIDIA H200, torch 2.11.0" in out and "8,938 img/s" in out
    with pytest.raises(UserError, match="no figure 'nope'"):
        reference.show("demo", ["nope"], folder=tmp_path)
    assert reference.show("missing", folder=tmp_path) is None
    assert "no GPU reference run recorded yet" in capsys.readouterr().out
