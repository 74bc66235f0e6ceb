"""The one size switch and the study runner (python -m tutorial_lib study): what a GPU study writes, and its
errors; the small mode of the checks of the loop (measure, spine) and the doctor's GPU record. The other studies'
small modes are tested beside their lessons' tests (test_ladder, test_bench, test_profiling)."""
import json
import re
from pathlib import Path

import pytest

from tutorial_lib import doctor, reference
from tutorial_lib.__main__ import main
from tutorial_lib.config import UserError
from tutorial_lib.lessons import size, studies
from tutorial_lib.sitecheck import Check

ROOT = Path(__file__).resolve().parents[1]


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


def test_a_study_that_ran_out_of_budget_prints_the_call_that_runs_the_rest(tmp_path, monkeypatch, capsys):
    from tutorial_lib.config import TrainConfig
    from tutorial_lib.lessons import cases

    def short_study(size, out):  # a device call's budget of 5 s: the long cases are skipped, not run
        runner = cases.Runner(out, budget_s=5, gpus_here=2)
        cfg = TrainConfig(device="cpu", steps=2)
        for name, gpus in (("long_a", 1), ("four", 4), ("long_b", 2)):
            runner.run(cases.Case(name, cfg, gpus, name, estimate_s=60))
        return {"99_short": {"runs": runner.records}}

    monkeypatch.setitem(studies.STUDIES, "short", studies.Study("short", "x:y", "99", 1, "a test's own study"))
    monkeypatch.setattr(studies.Study, "function", lambda self: short_study)
    studies.run("short", size.Size(True, "test"), tmp_path / "out")
    out = capsys.readouterr().out
    assert "2 cases did not fit in this call's budget" in out  # not the case this node has too few GPUs for
    assert f"python -m tutorial_lib study short --only long_a,long_b --out {tmp_path / 'out'}" in out


def test_reference_needs_full_sizes(tiny, tmp_path):
    with pytest.raises(UserError, match="without --small"):
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


def test_each_launch_script_named_by_a_study_launches_it():
    """Study.launcher is how records made before a study moved into tutorial_lib name it (--compare matches
    them): each must be the script in scripts/gpu/ whose launch line runs that study."""
    for study in studies.STUDIES.values():
        if study.launcher:
            text = (ROOT / study.launcher).read_text()
            assert f"python3 -m tutorial_lib study {study.name} " in text, (study.name, study.launcher)


def test_the_notebook_session_is_the_one_size(monkeypatch):
    from tutorial_lib import notebook

    monkeypatch.setenv(size.ENV, "small")
    s = notebook.setup(quiet=True)
    assert isinstance(s, size.Size) and s.small and s.pick(1, 2) == 1 and "WORKBOOK_SIZE" in s.why


def test_every_study_is_tested_in_its_small_mode():
    """Each registered study's small mode runs somewhere in tests/: a test file that calls `studies.run(` names
    the study (`studies.run("NAME", ...)`, or its name in a list it runs)."""
    texts = [p.read_text() for p in (ROOT / "tests").glob("test_*.py")]
    tested = {w for t in texts if "studies.run(" in t for w in re.findall(r"\"(\w+)\"", t)}
    assert set(studies.STUDIES) <= tested, f"no small-mode test for {sorted(set(studies.STUDIES) - tested)}"


def test_the_measure_study_checks_one_way_to_measure(tmp_path, one_thread):
    """scripts/gpu/measure.sh on a GPU: train and bench on one loader-bound run, TensorBoard's rate, a profiled
    run of 2 cycles without warnings, two verdicts; its figures in the reference record `measure`."""
    written = studies.run("measure", size.Size(True, "test"), tmp_path)
    record = reference.load("measure", tmp_path)
    assert set(written) == {"measure"} and record["card"] == "CPU (small mode)"
    f = record["figures"]
    lb = f["loader_bound"]
    assert lb["train_img_s"] > 0 and lb["bench_full_img_s"] > 0 and lb["batch_size"] == 8
    assert lb["bench_full_windows"][0] <= lb["bench_full_img_s"] <= lb["bench_full_windows"][1]
    assert lb["step_ms"]["p10"] <= lb["step_ms"]["median"] <= lb["step_ms"]["p90"]
    assert f["tensorboard"]["points"] >= 2 and f["tensorboard"]["median_img_per_s"] > 0
    assert f["profiler_clears_events_warnings"] == 0
    assert set(f["verdicts"]) == {"gpu_resident", "8 workers"}
    names = ("input", "bursts", "contended", "step", "balanced", "not settled", "disagrees")  # bench.bound's, on a CPU
    assert all(v["bound"] in names and v["verdict"] for v in f["verdicts"].values()), f["verdicts"]


def test_the_spine_study_tabulates_one_device_and_two_ranks(tmp_path, one_thread):
    """scripts/gpu/spine.sh on a GPU: fp32 and bf16 + channels_last on one GPU, DDP on 1 and 2 (small: fp32 +
    channels_last, DDP on 2 gloo processes), one table; no reference record."""
    assert studies.run("spine", size.Size(True, "test"), tmp_path) == {}
    rows = {r["run"]: r for r in json.loads((tmp_path / "spine.json").read_text())}
    assert list(rows) == ["fp32", "fp32_cl", "ddp2"]
    assert rows["ddp2"]["ranks"] == 2 and rows["ddp2"]["in sync"] and rows["fp32"]["ranks"] == 1
    assert all(r["img/s"] > 0 and r["val acc %"] is not None for r in rows.values())
    text = (tmp_path / "spine.md").read_text()
    table = [line for line in text.splitlines() if line.startswith("|")]
    assert len(table) == 2 + len(rows) and "| ddp2 | CPU" in text
    assert "DDP on 2: " in text and "weak-scaling efficiency" in text  # against fp32_cl, the run without DDP


def test_doctor_out_writes_the_report_and_the_gpu_lines_as_a_reference_record(tmp_path, monkeypatch, capsys):
    """scripts/gpu/doctor.sh: `doctor --out DIR --reference` (here the checks are given, as a GPU node's)."""
    checks = [Check("gpus", "PASS", "4 GPU(s): NVIDIA H100 80GB HBM3", seconds=1.0),
              Check("nccl", "PASS", "all-reduce over 4 nccl ranks correct", seconds=9.0),
              Check("slurm", "SKIP", "no Slurm here", seconds=0.5)]
    gpu = {"torch": "2.11.0+cu130", "gpus": [["NVIDIA H100 80GB HBM3", 79.2]] * 4}
    monkeypatch.setattr(doctor, "run", lambda opts, show=True, **kw: doctor.Report(checks, torch=gpu))
    monkeypatch.setattr(reference, "FOLDER", tmp_path / "committed")
    assert main(["doctor", "--out", str(tmp_path / "out"), "--reference"]) == 0
    report = json.loads((tmp_path / "out" / "doctor.json").read_text())
    assert [c["name"] for c in report["checks"]] == ["gpus", "nccl", "slurm"]
    assert "SKIP  slurm" in (tmp_path / "out" / "doctor.txt").read_text()
    for folder in (tmp_path / "out" / "reference", tmp_path / "committed"):
        record = reference.load("doctor", folder)
        assert (record["card"], record["gpus"], record["torch"]) == ("NVIDIA H100 80GB HBM3", 4, "2.11.0+cu130")
        assert record["figures"] == {"gpus": "PASS: 4 GPU(s): NVIDIA H100 80GB HBM3",
                                     "nccl": "PASS: all-reduce over 4 nccl ranks correct", "seconds_all_checks": 10.5}
    monkeypatch.setattr(doctor, "run", lambda opts, show=True, **kw: doctor.Report(checks, torch={"torch": "2.14.1"}))
    assert main(["doctor", "--out", str(tmp_path / "cpu"), "--reference"]) == 2  # no GPU: nothing committed
    assert "no CUDA GPU is visible" in capsys.readouterr().err
    assert reference.load("doctor", tmp_path / "cpu" / "reference")["card"] == "none (no CUDA GPU visible)"


def test_the_cluster_study_checks_energy_a_hang_and_the_binding(tmp_path, one_thread):
    """scripts/gpu/cluster.sh on a GPU node; here its CPU path: the energy check says why it has nothing to check
    against, the drill names rank 1 on gloo, the binding check says why there is nothing to bind. The page renders
    it, and a GPU node's figures too."""
    from tutorial_lib import perfdoc

    studies.run("cluster", size.Size(True, "test"), tmp_path)
    record = reference.load("06_cluster_checks", tmp_path)
    e, h, n = (record["figures"][k] for k in ("energy", "hang", "numa"))
    assert e["energy_j"] is None and e["energy_note"] and "nothing to check the counter against" in e["why"]
    assert h["backend"] == "gloo" and h["suspects"] == [1] and h["dist_timeout_s"] == 3
    assert 3 <= h["after_freeze_s"] < 60 and "rank 1" in h["verdict"]
    assert n["why"].startswith("no GPU here")
    page = "\n".join(perfdoc.cluster_section(record))
    assert "## Cluster checks on CPU (small mode)" in page and "- **Hang drill**: gloo, rank 1 frozen" in page
    assert perfdoc.NCCL_WAIT not in page  # what fills the time after an NCCL timeout is said of NCCL runs only
    gpu = {**record, "figures": {
        "energy": {"nvml_j": 33306.8, "power_draw_j": 33348.1, "window_s": 48.5, "ratio": 0.99876,
                   "within_5_percent": True, "joules_per_image": 0.00856, "throughput_img_s": 80558},
        "hang": {**h, "backend": "nccl"},
        "numa": {"gpus": {}, "img_s": {"unbound_1": 100.0, "bound_1": 110.0, "unbound_2": 100.0, "bound_2": 110.0},
                 "bound_over_unbound": 1.1, "run": {"gpus": 4}}}}
    page = "\n".join(perfdoc.cluster_section(gpu))
    assert "33,307 J over the timed window (48.5 s)" in page and "ratio 0.9988 (within 5%)" in page
    assert "DDP on 4 GPUs" in page and "1.10x (unbound_1 100" in page
    assert "bound (each rank on its GPU's NUMA node) against unbound" in page  # a record made before the mode
    gpu["figures"]["numa"]["mode"] = "each rank on its own share of the cores"
    assert "bound (each rank on its own share of the cores) against unbound" in "\n".join(perfdoc.cluster_section(gpu))
    assert f"dist_timeout_s=3{perfdoc.NCCL_WAIT}; rank 1" in page


# ------------------------------------------------------------------------------------------ a rerun, compared
def _run(img_s, p10=0.98, p90=1.02, **config):
    return {"config": {"batch_size": 256, "out_dir": "x", **config},
            "result": {"throughput_img_s": img_s, "step_time_ms": {"median": 10.0, "p10": 10.0 * p10, "p90": 10.0 * p90}}}


def _study_record(runs, card="NVIDIA H200", date="2026-11-28"):
    return {"card": card, "gpus": 4, "torch": "2.11.0+cu130", "date": date,
            "script": "python -m tutorial_lib study scaling", "figures": {"runs": runs}}


def test_a_rerun_is_compared_case_by_case_within_the_spread_of_its_steps():
    old = _study_record({"same": _run(1000.0), "faster": _run(1000.0), "slower": _run(1000.0),
                         "changed": _run(1000.0), "gone": _run(1000.0), "failed": {"status": "failed"},
                         "kept": _run(1000.0)})
    new = _study_record({"same": _run(1040.0), "faster": _run(1300.0), "slower": _run(700.0), "kept": _run(1000.0),
                         "changed": _run(1000.0, batch_size=1024, out_dir="elsewhere"), "failed": _run(900.0)})
    rows = {r["case"]: r for r in studies.compare(old, new)}
    assert set(rows) == {"same", "faster", "slower", "changed", "kept"}  # in both, with a throughput in both
    assert rows["kept"]["verdict"] == studies.KEPT  # the same figures: a partial rerun (--only) kept it
    assert rows["same"]["verdict"] == "within the run-to-run spread" and rows["same"]["ratio"] == pytest.approx(1.04)
    assert rows["faster"]["verdict"] == "faster now"  # by the one rule (lessons/noise.py)
    assert rows["slower"]["verdict"] == "slower now"
    assert rows["changed"]["verdict"] == "another configuration (batch_size)"  # out_dir is where, not what
    lines = studies.comparison_lines(old, new)
    assert lines[-1] == ("1 of 4 cases that ran in both records are within the run-to-run spread "
                         "(1 kept from before, not rerun)")
    assert "| same | 1,000 | 1,040 | x1.04 | within the run-to-run spread |" in lines  # single runs: the floor judges
    assert not any(line.startswith("another card") for line in lines)
    assert studies.comparison_lines(_study_record({}), new)[-1] == \
        "no case has a throughput in both records: nothing to compare"
    assert any(line.startswith("another card") for line in studies.comparison_lines(
        _study_record({}, card="NVIDIA H100 80GB HBM3"), new))


def test_compare_reads_the_committed_record_and_refuses_another_studys(tmp_path, capsys):
    old = tmp_path / "old.json"
    old.write_text(json.dumps(reference.load("06_scaling")))
    assert main(["study", "scaling", "--compare", str(old)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith("every case has the same figures in both records")  # itself
    assert out.count(studies.KEPT) > 3
    old.write_text(json.dumps({**reference.load("06_scaling"), "script": "python -m tutorial_lib study dpddp"}))
    assert main(["study", "scaling", "--compare", str(old)]) == 2
    assert "not of study scaling (python -m tutorial_lib study scaling or scripts/gpu/scaling.sh)" in capsys.readouterr().err
    assert main(["study", "scaling", "--compare", str(tmp_path / "none.json")]) == 2
    assert "no such file" in capsys.readouterr().err


@pytest.mark.parametrize("bound, verdict", [
    ((115, 112), "bound is faster in both pairs (x1.15, x1.12)"), ((85, 88), "bound is slower in both pairs"),
    ((103, 97), "within noise in both pairs (x1.03, x0.97)"), ((110, 108), "bound is faster in both pairs"),
    ((115, 103), "the two pairs disagree (x1.15, x1.03)")])  # the 4x H200 record's pairs: not settled
def test_binding_is_judged_pair_by_pair(bound, verdict):
    from tutorial_lib.lessons import cluster

    runs = {"unbound_1": 100.0, "bound_1": float(bound[0]), "unbound_2": 100.0, "bound_2": float(bound[1])}
    assert cluster.binding_verdict(runs).startswith(verdict)


@pytest.mark.parametrize("nodes, exclusive", [((0, 0, 0, 0), True), ((0, 0, 1, 1), False)])
def test_the_binding_check_measures_on_any_multi_gpu_node(tmp_path, monkeypatch, nodes, exclusive):
    """On one NUMA node (every lent 4-GPU node so far) binding to it changes nothing, so the bound runs give each
    rank its share of the cores (--exclusive); on two, each rank its GPU's node. Alternated twice; the ratio is
    the bound runs' img/s over the unbound ones'. The torchrun runs are stood in for here (a GPU node runs them)."""
    from types import SimpleNamespace

    from tutorial_lib.config import TrainConfig
    from tutorial_lib.lessons import cluster

    places = [{"gpu": g, "numa_node": n, "cpus": f"{16 * g}-{16 * g + 15}"} for g, n in enumerate(nodes)]
    launched = []

    def fake_run(words, **kw):
        if "--places" in words:
            return SimpleNamespace(stdout=json.dumps(places))
        launched.append(words)
        out_dir = next(w.split("=", 1)[1] for w in words if w.startswith("out_dir="))
        bound = "--exec-bound" in words
        Path(out_dir).mkdir(parents=True)
        (Path(out_dir) / "result.json").write_text(json.dumps({"throughput_img_s": 110.0 if bound else 100.0}))
        return SimpleNamespace(returncode=0)

    monkeypatch.setattr(cluster.subprocess, "run", fake_run)
    n = cluster.numa_check(TrainConfig(device="cpu"), size.Size(False, "test"), tmp_path, [0, 1, 2, 3])
    assert list(n["img_s"]) == ["unbound_1", "bound_1", "unbound_2", "bound_2"]
    assert n["bound_over_unbound"] == pytest.approx(1.1) and n["run"]["gpus"] == 4
    assert n["verdict"] == "bound is faster in both pairs (x1.10, x1.10), beyond the 5% that two runs differ by anyway"
    assert [("--exclusive" in w) for w in launched] == [False, exclusive, False, exclusive]
    assert n["mode"].startswith("each rank on its own share" if exclusive else "each rank on its GPU's NUMA node")
    assert cluster.numa_check(TrainConfig(device="cpu"), size.Size(False, "test"), tmp_path, [0])["why"] == \
        "one GPU: DDP needs two"


def test_a_rerun_of_a_ladder_or_of_flat_figures_is_compared_too(tmp_path):
    rung = {"rung": "fp32", "img_s": 1000.0, "step_ms": 10.0, "step_ms_p10": 9.0, "step_ms_p90": 11.0, "skipped": None}
    old = {**_study_record({}), "figures": {"rows": [rung, {"rung": "tf32", "skipped": "no GPU"}]}}
    new = {**_study_record({}), "figures": {"rows": [{**rung, "img_s": 1150.0}]}}
    (row,) = studies.compare(old, new)
    assert row["case"] == "rung fp32" and row["before_band"].spread == pytest.approx((1000 * 10 / 11, 1000 * 10 / 9))
    # the p10-p90 spread of single steps (909-1,111) is no interval of the mean: the rows keep no step count, so
    # only the floor judges them, and 15% is beyond it
    assert row["verdict"] == "faster now"
    flat_old = {**_study_record({}), "figures": {"device": "x", "ddp_img_s": 1000.0, "step_ms": 5.0}}
    flat_new = {**_study_record({}), "figures": {"device": "x", "ddp_img_s": 1200.0, "step_ms": 9.0}}
    (row,) = studies.compare(flat_old, flat_new)  # throughputs only, each within the noise floor of +-5%
    assert row["case"] == "ddp_img_s" and row["verdict"] == "faster now"


def test_the_rerun_is_compared_with_the_one_record_it_replaced(tmp_path):
    rec = {**_study_record({"a": _run(1000.0)}), "script": "scripts/gpu/ladder.sh"}
    for name, card in (("04_ladder", "NVIDIA H100 80GB HBM3"), ("04_ladder_h100", "NVIDIA H100 80GB HBM3"),
                       ("04_ladder_h200", "NVIDIA H200")):
        reference.write(name, rec["figures"], script=rec["script"], card=card, gpus=4, folder=tmp_path)
    h100 = {**rec, "card": "NVIDIA H100 80GB HBM3"}
    assert studies.counterpart(h100, tmp_path)["card"] == "NVIDIA H100 80GB HBM3"  # a copy under two names is one
    assert studies.counterpart(rec, tmp_path)["card"] == "NVIDIA H200"
    reference.write("04_ladder_h100", {"runs": {"a": _run(900.0)}}, script=rec["script"],
                    card="NVIDIA H100 80GB HBM3", gpus=4, folder=tmp_path)
    with pytest.raises(UserError, match="2 records .* on 4x NVIDIA H100 80GB HBM3; the rerun's record must replace"):
        studies.counterpart(h100, tmp_path)
    with pytest.raises(UserError, match="0 records"):
        studies.counterpart({**rec, "gpus": 2}, tmp_path)
    # the rerun through the entry point replaced a record its launch script wrote before the move
    reference.write("04_ladder_h200", {"runs": {"a": _run(1010.0)}}, script="python -m tutorial_lib study ladder",
                    card="NVIDIA H200", gpus=4, folder=tmp_path)
    with pytest.raises(UserError, match="0 records in .* come from scripts/gpu/ladder.sh on 4x NVIDIA H200"):
        studies.counterpart(rec, tmp_path)
    now = studies.counterpart(rec, tmp_path, scripts=studies.get("ladder").scripts())
    assert now["script"] == "python -m tutorial_lib study ladder" and studies.compare(rec, now)[0]["now"] == 1010.0
