"""A damaged record read by any command ends in one line naming the file and what to do: the commands a user
runs after a failure (`hang`, `study --compare`) meet such files most (a copy cut short, a full disk, a file
of something else). Every reader of the workbook's JSON records goes through results.read_record.
docs/reliability.md lists the promise."""
from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import pytest

from conftest import tiny
from test_reliability import one_line_error  # the CLI fails with exit 2 and one line on stderr
from tutorial_lib import compilecache, engine, reference
from tutorial_lib.__main__ import main
from tutorial_lib.config import UserError
from tutorial_lib.lessons import hang, scaling
from tutorial_lib.results import load_result, read_record

ROOT = Path(__file__).resolve().parents[1]


def damaged(text: str, how: str, drop: str) -> bytes:
    """`text` (a JSON object) damaged as a user's file may be: cut short, a list, without the key `drop`, a binary
    file, empty, or with `drop` of the wrong type."""
    record = json.loads(text)
    return {"truncated": text[: len(text) // 2].encode(), "a list": b"[1, 2]", "a number": b"7",
            "incomplete": json.dumps({k: v for k, v in record.items() if k != drop}).encode(),
            "binary": pickle.dumps(record), "empty": b"",
            "wrong type": json.dumps({**record, drop: [1]}).encode()}[how]


DAMAGE = ["truncated", "a list", "a number", "incomplete", "binary", "empty", "wrong type"]




@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A tiny run that finished: its result.json and ranks/rank0.json."""
    cfg = tiny(tmp_path_factory.mktemp("finished") / "run", steps=2, timing_warmup=0, eval=False)
    engine.train(cfg)
    return Path(cfg.out_dir)


@pytest.mark.parametrize("how", DAMAGE)
def test_hang_on_a_damaged_rank_file_names_it_with_what_to_do(finished, tmp_path, capsys, how):
    (tmp_path / "ranks").mkdir()
    good = (finished / "ranks" / "rank0.json").read_text()
    (tmp_path / "ranks" / "rank0.json").write_bytes(damaged(good, how, "step_completed"))
    err = one_line_error(["hang", str(tmp_path)], capsys)
    assert str(tmp_path / "ranks" / "rank0.json") in err and "not a rank's last words" in err
    assert "run hang again" in err


def test_hang_on_a_rank_file_whose_failure_is_damaged_names_it(finished, tmp_path, capsys):
    (tmp_path / "ranks").mkdir()
    words = json.loads((finished / "ranks" / "rank0.json").read_text())
    (tmp_path / "ranks" / "rank0.json").write_text(json.dumps({**words, "failure": {"error": 3}}))
    err = one_line_error(["hang", str(tmp_path)], capsys)
    assert "rank0.json: its failure lacks in, collective" in err



def test_hang_on_a_run_that_finished_says_so(finished, capsys):
    assert main(["hang", str(finished)]) == 0
    out = capsys.readouterr().out
    assert "the run finished normally: every rank completed step 2; there is no hang to explain" in out
    assert "failed" not in out and "torchfrtrace" not in out  # no hang's commands for a run that did not hang


def _words(rank, state, failure=None):
    return {"rank": rank, "world_size": 2, "host": "node1", "pid": 100 + rank, "backend": "gloo", "state": state,
            "step_completed": 3, "total_steps": 10, "phase": "between phases", "phase_since": None, "written": 3.0,
            "failure": failure}


@pytest.mark.parametrize("state,failure,verdict", [
    ("stopped", None, "the run was stopped by a signal (scancel, a time limit) at step 3, with a checkpoint: no hang"),
    ("failed", {"in": "forward", "collective": None, "error": "NonFiniteLoss: the loss became nan"},
     "every rank failed with an error of its own at step 3, none in a collective: not a hang (rank 0: NonFinite")])
def test_hang_on_a_run_that_did_not_hang_says_what_ended_it(tmp_path, state, failure, verdict):
    (tmp_path / "ranks").mkdir()
    for rank in (0, 1):
        (tmp_path / "ranks" / f"rank{rank}.json").write_text(json.dumps(_words(rank, state, failure)))
    report = hang.read_report(tmp_path)
    assert report.verdict().startswith(verdict) and "stopped answering" not in str(report)

@pytest.mark.parametrize("how", DAMAGE)
def test_study_compare_on_a_damaged_record_names_it_with_what_to_do(tmp_path, capsys, how):
    old = tmp_path / "old.json"
    old.write_bytes(damaged(json.dumps(reference.load("06_scaling")), how, "figures"))
    err = one_line_error(["study", "scaling", "--compare", str(old)], capsys)
    assert f"{old} " in err and "not a reference record" in err and "git show HEAD~1:notebooks/reference" in err


@pytest.mark.parametrize("cases", [[1, 2], {"a": "text"}, {"a": {"result": [1]}},
                                   {"a": {"result": {"throughput_img_s": "fast", "step_time_ms": {"median": 1}}}},
                                   {"a": {"result": {"throughput_img_s": 5.0, "step_time_ms": {"median": "x"}}}}])
def test_study_compare_leaves_out_cases_it_cannot_read(tmp_path, capsys, cases):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({**reference.load("06_scaling"), "figures": {"runs": cases}}))
    assert main(["study", "scaling", "--compare", str(old)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "no case has a throughput in both records: nothing to compare"


def _readers(run: Path, tmp_path: Path):
    """Each reader of a workbook record, the file it reads and the key it must find (`drop`), as a user calls
    it: (call, file, key)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / compilecache.MANIFEST).write_text(json.dumps({"entries": {}}))
    (tmp_path / "reference").mkdir()
    (tmp_path / "reference" / "r.json").write_text(json.dumps(reference.load("06_scaling")))
    return {"load_result": (lambda: load_result(run), run / "result.json", "config"),
            "scaling.as_dict": (lambda: scaling.as_dict(str(run)), run / "result.json", "step_time_ms"),
            "reference.load": (lambda: reference.load("r", tmp_path / "reference"), tmp_path / "reference" / "r.json",
                               "figures"),
            "compile cache manifest": (lambda: compilecache.read_manifest(cache), cache / compilecache.MANIFEST,
                                       "entries"),
            "hang.last_words": (lambda: hang.last_words(run / "ranks" / "rank0.json"), run / "ranks" / "rank0.json",
                                "rank")}


@pytest.mark.parametrize("reader", ["load_result", "scaling.as_dict", "reference.load", "compile cache manifest",
                                    "hang.last_words"])
@pytest.mark.parametrize("how", DAMAGE)
def test_every_reader_of_a_record_names_the_damaged_file(finished, tmp_path, reader, how):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished, run)
    call, path, key = _readers(run, tmp_path)[reader]
    call()  # the record as written reads
    if how == "a number" and reader == "compile cache manifest":
        how = "a list"
    path.write_bytes(damaged(path.read_text(), how, key))
    with pytest.raises(UserError) as e:
        call()
    said = str(e.value)
    assert said.startswith(f"{path} ") and "\n" not in said and ";" in said, said  # the file, then what to do


def test_read_record_says_what_is_wrong(tmp_path):
    path = tmp_path / "r.json"
    said = {}
    for how, content in {"cut": b'{"a": 1, "b"', "list": b"[1]", "text": b"\xff\xfe\x00", "key": b'{"a": 1}',
                         "type": b'{"a": 1, "b": true}', "empty": b" \n"}.items():
        path.write_bytes(content)
        with pytest.raises(UserError) as e:
            read_record(path, "a demo record", "write it again", {"a": int, "b": (int, float)})
        said[how] = str(e.value)
    assert "is not complete JSON (cut short?" in said["cut"] and "holds an array, not an object" in said["list"]
    assert "is not text (a binary file?)" in said["text"] and "lacks b" in said["key"]
    assert "has b=true, not a number" in said["type"] and "is empty" in said["empty"]
    assert all(s.endswith("so it is not a demo record; write it again") for s in said.values()), said
    with pytest.raises(UserError, match="does not exist"):
        read_record(tmp_path / "none.json", "a demo record", "write it again")
    path.write_text('{"a": 1, "b": 2.5}')
    assert read_record(path, "a demo record", "write it again", {"a": int, "b": (int, float)}) == {"a": 1, "b": 2.5}


# Readers of JSON that are not the workbook's records of a run, or read what the same study's own process has
# just written (a damaged one there is that run's failure, reported as such): the rest read through read_record.
NOT_RECORDS = {"reference.py": "a notebook's cells", "sitecheck.py": "Jupyter's runtime files (skipped if damaged)",
               "tensorboard.py": "Jupyter's runtime files and TensorBoard's answers (damaged: none known)",
               "trace_summary.py": "a Chrome trace (its own one-line error)", "profiling.py": "TensorBoard's answer",
               "gpucheck.py": "a child process's output", "jobs.py": "a line of a job file (its own one-line error)",
               "lessons/cluster.py": "its own runs and a child's output", "lessons/cases.py": "its own runs",
               "lessons/data_loading.py": "its own run", "lessons/card_report.py": "the committed card records",
               "results.py": "read_record itself", "doctor.py": "a child process's output (its own error line)",
               "kernel.py": "the kernel spec ipykernel has just written",
               "lessons/memory_runs.py": "the list of runs the notebook's own cell has just written",
               "lessons/memory_oom.py": "a child process's output"}


def test_every_other_json_record_is_read_through_read_record():
    package = ROOT / "tutorial_lib"
    raw = sorted(str(p.relative_to(package)) for p in package.rglob("*.py")
                 if re.search(r"json\.loads?\(", p.read_text()))
    assert [p for p in raw if p not in NOT_RECORDS] == []


@pytest.mark.parametrize("key", ["steps", "window", "warmup", "job_steps"])
def test_a_card_count_in_other_digits_is_one_line(key):
    """'²'.isdigit() is true and int('²') fails: the card's counts were a ValueError traceback."""
    from tutorial_lib.config import UserError
    from tutorial_lib.lessons import card

    with pytest.raises(UserError) as e:
        card.split_overrides({key: "²"})
    assert str(e.value).startswith(f"{key}='²': ") and "\n" not in str(e.value)


def test_ddp_gpus_in_other_digits_is_one_line():
    from tutorial_lib.config import UserError
    from tutorial_lib.lessons import card_ddp

    with pytest.raises(UserError, match="ddp_gpus='²'"):
        card_ddp.gpus_to_measure("²")
