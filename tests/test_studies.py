"""The one size switch and the study runner (python -m tutorial_lib study): what a GPU study writes, and its
errors. Each registered study's own small mode is tested beside its lesson's tests."""
import json

import pytest

from tutorial_lib.__main__ import main
from tutorial_lib.config import UserError
from tutorial_lib.lessons import size, studies


def test_the_size_is_decided_by_flag_then_environment_then_machine(monkeypatch):
    monkeypatch.setenv(size.ENV, "full")
    assert size.current(small=True).small  # --small wins
    assert not size.current().small and "WORKBOOK_SIZE" in size.current().why
    monkeypatch.setenv(size.ENV, "small")
    assert size.current().pick(1, 2) == 1
    monkeypatch.delenv(size.ENV)
    import torch

    assert size.current().small == (not torch.cuda.is_available())


def test_a_bad_size_names_the_value_and_the_fix(monkeypatch):
    monkeypatch.setenv(size.ENV, "huge")
    with pytest.raises(UserError, match=r"WORKBOOK_SIZE='huge'.*small.*full"):
        size.current()


def tiny_study(sz, out):
    (out / "table.md").write_text("| a |\n")
    return {"99_tiny": {"img_s": sz.pick(10.0, 1000.0)}}


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setitem(studies.STUDIES, "tiny", studies.Study("tiny", "x:y", "99", 1, "a test's own study"))
    monkeypatch.setattr(studies.Study, "function", lambda self: tiny_study)


def test_a_small_study_writes_its_reference_record_into_out_only(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(studies.reference, "FOLDER", tmp_path / "committed")
    written = studies.run("tiny", size.Size(True, "test"), tmp_path / "out")
    record = json.loads(written["99_tiny"].read_text())
    assert written["99_tiny"].parent == tmp_path / "out"
    assert record["card"] == "CPU (small mode)" and record["figures"] == {"img_s": 10.0}
    assert record["script"] == "python -m tutorial_lib study tiny"
    assert (tmp_path / "out" / "table.md").is_file() and not (tmp_path / "committed").exists()


def test_reference_needs_full_sizes(tiny, tmp_path):
    with pytest.raises(UserError, match="drop --small"):
        studies.run("tiny", size.Size(True, "test"), tmp_path, write_reference=True)


def test_the_cli_lists_studies_and_refuses_an_unknown_one(tiny, capsys):
    assert main(["study", "--list"]) == 0
    assert "ladder" in capsys.readouterr().out
    assert main(["study", "no_such_study", "--small"]) == 2
    assert "no study named 'no_such_study'" in capsys.readouterr().err


def test_only_is_refused_by_a_study_that_does_not_keep_its_cases(tiny, capsys):
    assert main(["study", "tiny", "--small", "--only", "a,b"]) == 2
    assert "study tiny does not keep its cases' records one by one" in capsys.readouterr().err


def test_every_registered_study_names_a_function_that_exists():
    for study in studies.STUDIES.values():
        assert callable(study.function()), study.name
