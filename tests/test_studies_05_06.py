"""The GPU studies of notebooks 05 and 06 (lessons/dpddp, ddp_probe, scaling_study) in their small mode on a CPU,
what they write, and the notebooks' cells that read those records: every table a learner reads shows values
recomputed from the runs' own results, and every reference cell runs on a record of the shape a 4-GPU node
writes (synthesised from the small runs: the same fields, more cases)."""
import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tutorial_lib.config import TrainConfig
from tutorial_lib.lessons import cases as cases_mod
from tutorial_lib.lessons import dpddp, ddp_probe, scaling, scaling_study, size, studies

ROOT = Path(__file__).resolve().parents[1]
SMALL = size.Size(True, "test")
FULL = size.Size(False, "test")


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """Each study's small mode, once: {study: (its figures, its output folder)}."""
    out = {}
    for name in ("dpddp", "ddp_probe", "scaling"):
        folder = tmp_path_factory.mktemp(name)
        written = studies.run(name, SMALL, folder)
        (ref_name, path), = written.items()
        record = json.loads(path.read_text())
        assert record["card"] == "CPU (small mode)" and record["script"] == f"python -m tutorial_lib study {name}"
        out[name] = (record["figures"], folder)
    return out


# ---------------------------------------------------------------------------------------- notebook 05's study
def test_dpddp_small_mode_records_every_case_and_its_tables(records):
    f, folder = records["dpddp"]
    assert list(f["cases"]) == [c.name for c in dpddp.cases(SMALL)]
    for rec in f["cases"].values():
        assert rec["status"] == "ok", rec
        r = rec["result"]
        assert r["throughput_img_s"] > 0 and r["config"]["device"] == "cpu" and "loss" not in r
    assert f["cases"]["dp_2"]["result"]["host_parts_ms"]["step"] > 0  # DataParallel's phases, timed on the host
    assert (folder / "cases.json").is_file() and (folder / "cases.log").read_text().count("=====") == 3
    assert "| DDP eager, 2 GPUs | 2 | 8 |" in (folder / "dp_vs_ddp.md").read_text()


def test_every_efficiency_in_05s_table_is_tl_scaling_efficiency_of_the_stored_results(records):
    """The summary-versus-result check for the reference: each row recomputed from the record's own results."""
    f, _ = records["dpddp"]
    rows = dpddp.rows(f)
    assert [r["case"] for r in rows] == ["dp_2", "ddp_eager_2"]
    one = f["cases"]["one_eager"]["result"]
    for row in rows:
        rec = f["cases"][row["case"]]
        gpus = rec["gpus"] if rec["result"]["config"]["parallel"] == "dp" else None
        p = scaling.efficiency(rec["result"], one, "weak", gpus)
        assert (row["efficiency"], row["speedup"], row["baseline_img_s"]) == (p.efficiency, p.speedup,
                                                                              one["throughput_img_s"])
        assert f"{row['efficiency']:.2f} |" in dpddp.table(f) and row["verdict"] in dpddp.table(f)


def test_a_row_without_a_one_gpu_run_of_its_recipe_has_no_efficiency():
    base = _result(1, 256, 100.0)
    graphed = _result(2, 256, 180.0, cuda_graph=True, parallel="ddp")
    f = {"cases": {"one": {"case": "one", "about": "1 GPU", "gpus": 1, "result": base},
                   "g": {"case": "g", "about": "DDP graph", "gpus": 2, "result": graphed}}}
    assert dpddp.comparison(f, "g") is None  # an eager single GPU is no baseline for a graphed step
    f["cases"]["one_graph"] = {"case": "one_graph", "about": "1 GPU graph", "gpus": 1,
                               "result": _result(1, 256, 100.0, cuda_graph=True)}
    assert dpddp.comparison(f, "g")["baseline"] == "1 GPU graph"


def test_verdicts_weigh_a_difference_against_the_spread():
    assert dpddp.relation(0.6, 0.05, "one GPU") == "slower than one GPU"
    assert dpddp.relation(1.03, 0.05, "one GPU") == "within noise of one GPU"
    assert dpddp.relation(1.5, 0.05, "x") == "faster than x"


def test_the_05_summary_reads_result_files_not_a_cells_variables(tmp_path):
    for name, gpus, img_s, parallel, batch in (("one", 1, 100.0, "none", 256), ("dp", 1, 60.0, "dp", 1024),
                                               ("ddp", 4, 380.0, "ddp", 256)):
        _save(tmp_path / name, _result(gpus, batch, img_s, parallel=parallel))
    traced = _result(4, 256, 200.0, parallel="ddp", profile=True)
    _save(tmp_path / "traced", traced)
    rows = {r["run"]: r for r in dpddp.summary_rows(tmp_path)}
    assert set(rows) == {"dp", "ddp"}  # a traced run is never a row
    assert rows["dp"]["gpus"] == 4 and rows["dp"]["efficiency"] == pytest.approx(60 / 400)
    assert rows["ddp"]["efficiency"] == pytest.approx(380 / 400) and rows["ddp"]["baseline"] == "one"


def test_the_committed_05_summary_shows_the_efficiency_its_launch_cell_printed():
    """The class of defect where a summary prints another cell's leftover variable: the committed outputs of the
    launch cell and of the summary table must carry the same efficiency."""
    out = _outputs(ROOT / "notebooks" / "05_dp_vs_ddp.ipynb")
    launch = next(o for o in out if "processes" in o and "efficiency" in o and "1 process" in o)
    summary = next(o for o in out if o.startswith("| run (folder under runs/05)"))
    printed = float(launch.split("efficiency ")[1].split(",")[0])
    ddp_row = next(line for line in summary.splitlines() if line.startswith("| ddp (ddp)"))
    assert float(ddp_row.split("|")[5]) == printed


def test_cudnn_trap_and_knobs_read_their_cases():
    f = {"cases": {"dp_4": {"gpus": 4, "result": _result(1, 1024, 12000.0, parallel="dp")},
                   "dp_4_cudnn": {"gpus": 4, "result": _result(1, 1024, 600.0, parallel="dp", cudnn_benchmark="force")},
                   "ddp_eager_2": {"gpus": 2, "result": _result(2, 256, 30000.0, parallel="ddp")},
                   "knob_accum": {"gpus": 2, "about": "grad_accum_steps=4",
                                  "result": _result(2, 256, 39000.0, parallel="ddp", grad_accum_steps=4)}}}
    assert dpddp.trap(f)["ratio"] == pytest.approx(0.05) and dpddp.trap(f)["verdict"] == "slower than the engine's setting"
    (knob,) = dpddp.knob_rows(f)
    assert knob["ratio"] == pytest.approx(1.3) and knob["verdict"] == "faster than the defaults"
    assert "| `grad_accum_steps=4` | 39,000 | 30,000 | 1.30x |" in dpddp.knob_table(f)


def test_the_case_runner_skips_what_the_node_or_the_budget_cannot_run(tmp_path, capsys):
    runner = cases_mod.Runner(tmp_path, budget_s=5, gpus_here=2)
    cfg = TrainConfig(device="cpu", steps=2)
    assert runner.run(cases_mod.Case("four", cfg, 4, "4 GPUs"))["status"] == "skipped: needs 4 GPUs, this node has 2"
    assert runner.run(cases_mod.Case("long", cfg, 1, "long", estimate_s=60))["status"].startswith(
        "skipped: 5 s of the study's budget left")
    assert "four" in capsys.readouterr().out and runner.result("four") is None


def test_the_monitor_averages_every_sample_of_the_timed_window_in_mib():
    samples = [(t, gpu, util, mem) for t in (1.0, 2.0, 3.0, 4.0) for gpu, util, mem in ((0, 90.0 if t > 2 else 0.0,
               2715.0), (1, 0.0 if t == 3 else 60.0, 2419.0))]
    fig = cases_mod.window_figures(samples, 2, end=4.0, seconds=2.5)  # the window holds t = 2, 3, 4
    assert fig["util_pct"] == [60.0, 40.0]  # the samples at 0% count: not only the busy ones
    assert fig["mem_used_mib"] == [2715.0, 2419.0] and fig["samples_per_gpu"] == 3


# ---------------------------------------------------------------------------------------- the probe (05's case study)
def test_ddp_probe_small_mode_traces_one_gpu_and_every_rank(records):
    f, _ = records["ddp_probe"]
    assert {k.rsplit("_rank", 1)[0] for k in f["gap_traces"]} == {"1gpu_graph_traced", "ddp_graph_traced_all"}
    gap = ddp_probe.class_gap(f)
    assert gap["ranks"] == 2 and gap["rows"]["the whole step"][0] > 0
    assert ddp_probe.forms(f) == []  # small: the traced pair only, no form's img/s


def test_the_committed_case_study_records_read_as_the_notebook_reads_them():
    from tutorial_lib import reference

    forms = ddp_probe.forms(reference.load("05_ddp_probe")["figures"])
    assert [f["form"] for f in forms][0] == "ddp_eager" and forms[0]["over_eager"] == 1.0
    assert "ddp_ro_split" not in [f["form"] for f in forms]  # traced in that run: its img/s is not shown
    for name in ("05_ddp_gap_before", "05_ddp_gap"):
        assert ddp_probe.class_gap(reference.load(name)["figures"])["ranks"] == 4


# ---------------------------------------------------------------------------------------- notebook 06's study
def test_scaling_small_mode_runs_every_stage_and_records_the_race(records):
    f, folder = records["scaling"]
    assert [p.gpus for p in scaling_study.points(f, "weak")] == [1, 2]
    assert f["runs"]["weak_1"]["bench"]["full"]["img_s"] > 0  # the bench's three measures, kept per point
    race = f["race"]
    assert race["images"] == 24 * 8 and 0 < race["target"] <= 1 and race["target_rule"]
    rows = scaling_study.race_rows(f)
    assert rows[0]["about"] == "1 GPU" and rows[0]["gpus"] == 1 and len(rows) == 2
    assert 0 <= f["comm"]["share"] < 1 and f["comm"]["ranks"] == 2
    h = scaling_study.headline(f)
    d = h["decomposition"]
    assert d.ratio == pytest.approx(d.gpus * d.weak_efficiency * d.recipe_gain)
    assert (folder / "06_scaling.partial.json").is_file()


def test_a_race_runs_costs_are_its_start_up_first_step_and_validations_before_the_target():
    rec = {"wall_s": 100.0, "result": {"wall_time_s": 80.0, "compile_time_s": 5.0, "global_batch": 256,
                                       "val_history": [[10, 20.0, 0.5], [20, 40.0, 0.9], [30, 70.0, 0.95]]}}
    c = scaling_study.race_costs(rec, 0.9)
    # start-up 20 s, first step 5 s, validations (80 - 5 - 70) / 3 s each, two of them before the target
    assert c["seconds_to_target"] == 40.0 and c["images_to_target"] == 20 * 256
    assert c["fixed_s"] == pytest.approx(20 + 5 + 2 * 5 / 3) and c["fixed_share"] == pytest.approx(
        c["fixed_s"] / (c["fixed_s"] + 40))
    assert scaling_study.race_costs(rec, 0.99)["seconds_to_target"] is None


def test_the_race_target_is_out_of_one_gpus_reach_in_its_first_seconds():
    history = [[1, 10.0, 0.80], [2, 50.0, 0.95], [3, 70.0, 0.951], [4, 90.0, 0.97]]
    assert scaling.race_target(history, after_s=60, resolution=0.0002) == 0.9502
    assert scaling.time_to_target({"val_history": history}, 0.9502) == 70.0  # past the first minute
    assert scaling.race_target(history[:2], after_s=60, resolution=0.001) is None  # never beaten later


# ---------------------------------------------------------------------------------------- the notebooks' cells
def reference_cells(notebook: Path) -> list[str]:
    """The code cells that read a reference record (F, REF, tl.reference.load) and train nothing."""
    src = ["".join(c["source"]) for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"]
    trains = ("tl.train(", "tl.launch(", "run(", "subprocess", "%%writefile", "jobs.write", "scaling.write")
    return [s for s in src if any(w in s for w in ("F[", "F)", "F and", "(F", "REF", "reference.load("))
            and not any(w in s for w in trains) and "REF = " not in s]


@pytest.mark.parametrize("notebook, study", [("05_dp_vs_ddp", "dpddp"), ("06_scaling", "scaling")])
def test_every_reference_cell_runs_on_the_record_a_gpu_node_writes(records, notebook, study, capsys, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import tutorial_lib as tl

    figures = full_shaped(study, records)
    rec = {"card": "NVIDIA H100 80GB HBM3", "gpus": 4, "torch": "2.11.0+cu130", "date": "2026-12-01",
           "script": f"python -m tutorial_lib study {study} --reference", "figures": figures}
    cells = reference_cells(ROOT / "notebooks" / f"{notebook}.ipynb")
    assert len(cells) >= 4
    from IPython.display import Markdown, display

    namespace = {"tl": tl, "REF": rec, "F": figures, "Markdown": Markdown, "display": display, "plt": plt}
    monkeypatch.chdir(ROOT)
    for source in cells:
        exec(compile(source, notebook, "exec"), namespace)  # noqa: S102 - the notebook's own cells
    text = capsys.readouterr().out
    assert "no reference run recorded yet" not in text and "Traceback" not in text


def full_shaped(study: str, records: dict) -> dict:
    """A record of the shape the full study writes on a 4-GPU node, built from the small runs' results (every
    case of the full list, each a small result resized to its GPUs and batch)."""
    f, _ = records[study]
    if study == "dpddp":
        small = f["cases"]
        out = copy.deepcopy(f)
        out["cases"], out["batch_per_gpu"] = {}, 8
        for case in dpddp.cases(FULL):
            kind = case.cfg.parallel
            src = small["one_eager" if kind == "none" else "dp_2" if kind == "dp" else "ddp_eager_2"]
            rec = copy.deepcopy(src)
            per_gpu = 8 * (case.cfg.batch_size // 256 if kind != "dp" else case.cfg.batch_size // (256 * case.gpus))
            rec.update(case=case.name, about=case.about, gpus=case.gpus)
            r = rec["result"]
            r["config"].update(batch_size=per_gpu * (case.gpus if kind == "dp" else 1), cuda_graph=case.cfg.cuda_graph,
                               profile=case.cfg.profile, cudnn_benchmark=case.cfg.cudnn_benchmark,
                               grad_accum_steps=case.cfg.grad_accum_steps)
            r["world_size"] = case.gpus if kind == "ddp" else 1
            r["global_batch"] = per_gpu * case.gpus * case.cfg.grad_accum_steps
            rec["monitor"] = {"util_pct": [50.0] * case.gpus, "mem_used_mib": [2000.0] * case.gpus}
            if case.cfg.profile:
                rec["trace"] = {"rank0": {"step_ms": 10.0, "parts_ms": {"compute": 5.0, "comm": 4.0, "idle": 1.0},
                                          "nccl_ms": 4.5, "allreduce_calls": 2.0, "host_ops": 2400.0}}
            out["cases"][case.name] = rec
        return out
    out = copy.deepcopy(f)
    runs = out["runs"]
    out["gpus"], out["counts"] = 4, [1, 2, 4]
    runs["weak_4"] = _resized(runs["weak_2"], 4)
    runs["strong_4"] = _resized(runs["weak_2"], 4, per_gpu=4)
    one = runs["race_1"]["result"]
    target = out["race"]["target"]
    one["val_history"] = [[s, t * 30, acc] for s, t, acc in one["val_history"]] + [[999, 90.0, target]]
    small_race = next(k for k in runs if k.startswith("race_2_"))
    for rule, per_gpu in (("sqrt", 8), ("linear", 8), ("none", 8), ("sqrt", 32)):
        rec = _resized(runs[small_race], 4, per_gpu=per_gpu)
        rec["about"] = f"4 GPUs, {per_gpu} per GPU, lr rule {rule}"
        rec["result"]["throughput_img_s"] = 4 * one["throughput_img_s"]
        rec["result"]["val_history"] = [[250, 25.0 * per_gpu / 8, target]]
        rec["result"]["config"].update(dataset=one["config"]["dataset"], val_size=one["config"]["val_size"])
        runs[f"race_4_{per_gpu}_{rule}"] = rec
    del runs[small_race]
    return out


def _resized(rec: dict, gpus: int, per_gpu: int | None = None) -> dict:
    rec = copy.deepcopy(rec)
    r = rec["result"]
    per_gpu = per_gpu or r["global_batch"] // r["world_size"]
    r["config"].update(batch_size=per_gpu, parallel="ddp")
    r["world_size"], r["global_batch"], rec["gpus"] = gpus, per_gpu * gpus, gpus
    return rec


# ---------------------------------------------------------------------------------------- the minimal DDP script
def test_ddp_minimal_runs_with_more_processes_than_gpus(tmp_path):
    """05's script on a server with one GPU and two processes: every rank takes the CPU and gloo (two NCCL ranks
    can't share a GPU), both finish, and DDP's broadcast makes their weights equal."""
    cells = json.loads((ROOT / "notebooks" / "05_dp_vs_ddp.ipynb").read_text())["cells"]
    script = next("".join(c["source"]) for c in cells if "".join(c["source"]).startswith("%%writefile"))
    (tmp_path / "runs" / "05").mkdir(parents=True)
    (tmp_path / "ddp_minimal.py").write_text(script.split("\n", 1)[1])
    fake = tmp_path / "fake"  # a server with one GPU: the script asks torch how many there are
    fake.mkdir()
    (fake / "sitecustomize.py").write_text("import torch\ntorch.cuda.device_count = lambda: 1\n"
                                           "torch.cuda.is_available = lambda: True\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(fake)}
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        "ddp_minimal.py"], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    ranks = sorted(line for line in p.stdout.splitlines() if line.startswith("rank"))
    assert len(ranks) == 2 and all("gloo" in line for line in ranks)
    after = {re.search(r"([+-]\d+\.\d+) after DDP", line).group(1) for line in ranks}
    assert len(after) == 1  # DDP's broadcast: one set of weights on every rank
    assert "accuracy over 1000 samples" in p.stdout and (tmp_path / "runs" / "05" / "ddp_minimal.pt").is_file()


# ---------------------------------------------------------------------------------------- helpers
def _result(gpus: int, batch: int, img_s: float, **cfg) -> dict:
    config = TrainConfig(**{"batch_size": batch, "device": "cpu", **cfg}).to_dict()
    return {"config": config, "device": "CPU", "world_size": gpus, "steps": 10, "global_batch": batch * gpus,
            "throughput_img_s": img_s, "step_time_ms": {"median": 10.0, "p10": 9.5, "p90": 10.5, "mean": 10.0},
            "val_history": [], "param_checksums": [1.0] * gpus}


def _save(folder: Path, result: dict) -> None:
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps(result))


def _outputs(notebook: Path) -> list[str]:
    texts = []
    for cell in json.loads(notebook.read_text())["cells"]:
        for o in cell.get("outputs", []):
            data = o.get("data", {})
            texts.append("".join(o.get("text") or data.get("text/markdown") or data.get("text/plain") or ""))
    return texts
