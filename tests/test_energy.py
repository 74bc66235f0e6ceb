"""What a run cost (tutorial_lib/energy.py, results.costs, the ledger's columns, a site's charge): GPU-hours from
GPUs x time, the energy counters read at the step clock's marks (null with the reason on a CPU), and the ledger of
notebook 06 with those columns and, where the site profile names a charge per GPU-hour, the cost."""
import csv
import json

import pytest
import torch

from conftest import tiny
from tutorial_lib import energy, sites
from tutorial_lib.config import UserError
from tutorial_lib.distributed import DistEnv
from tutorial_lib.lessons import scaling
from tutorial_lib.results import Result

STEP = {"median": 10.0, "slowest_rank_total_s": 900.0}


def made(**kw) -> Result:
    base = dict(config={}, device="NVIDIA H100", world_size=4, steps=100, global_batch=4096, throughput_img_s=1e5,
                step_time_ms=STEP, data_wait_ms=0.0, loss=[], final_loss=1.0, val_accuracy=0.9, peak_memory_mb=None,
                param_checksums=[], resumed_from_step=None, wall_time_s=1800.0, torch_version="2.14.1", gpus=4,
                loop_s=1200.0, energy_loop_j=7.2e6)
    return Result(**{**base, **kw})


def test_gpu_hours_are_gpus_times_the_wall_time_and_the_timed_part_separately():
    r = made()
    assert (r.gpu_hours, r.gpu_hours_timed) == (2.0, 1.0)  # 4 GPUs x 1800 s; 4 x 900 s of timed steps
    assert r.gpu_hours_to_target is None and r.kwh_to_target is None  # it ran its steps: no target reached


def test_a_run_stopped_by_its_target_reports_gpu_hours_and_kwh_to_it():
    r = made(stopped_by="target_accuracy")
    assert r.gpu_hours_to_target == pytest.approx(4 * 1200 / 3600) and r.kwh_to_target == pytest.approx(2.0)
    resumed = made(stopped_by="target_accuracy", resumed_from_step=50)  # its loop is not the whole run
    assert resumed.gpu_hours_to_target is None and resumed.kwh_to_target is None
    assert made(stopped_by="target_accuracy", energy_loop_j=None).kwh_to_target is None  # no counter


def test_old_result_files_load_without_the_cost_fields(tmp_path):
    r = made()
    values = {k: v for k, v in r.__dict__.items() if k not in ("gpus", "gpu_hours", "gpu_hours_timed")}
    assert Result(**values).gpu_hours is None


def test_a_cpu_run_records_zero_gpu_hours_and_null_energy_with_the_reason(tmp_path):
    from tutorial_lib import engine

    engine.train(tiny(tmp_path / "run", steps=3, timing_warmup=1, eval=False))
    r = json.loads((tmp_path / "run" / "result.json").read_text())
    assert (r["gpus"], r["gpu_hours"], r["gpu_hours_timed"]) == (0, 0.0, 0.0)
    assert r["energy_j"] is None and r["joules_per_image"] is None and r["energy_per_gpu_j"] is None
    assert r["energy_note"] == "no GPU: a CPU run has no energy counter"
    assert 0 < r["loop_s"] <= r["wall_time_s"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the reason given where no NVML library loads")
def test_without_an_nvml_library_the_reason_names_the_package_to_install():
    energy._READER.clear()
    with pytest.raises(energy.NoCounter, match="pip install nvidia-ml-py"):
        energy.read_mj(0)
    energy._READER.clear()


def fake_gpus(monkeypatch, joules: dict, allocations: dict, n=2):
    """GPUs whose counters read joules[i][k] at the k-th mark and whose allocations count allocations[i][k]."""
    calls = {i: 0 for i in range(n)}

    def read(i):
        calls[i] += 1
        return int(1000 * joules[i][calls[i] - 1])
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    monkeypatch.setattr(energy, "read_mj", read)
    monkeypatch.setattr(energy, "_allocations", lambda i: allocations[i][calls[i] - 1])


def meter_at(marks=("loop", "window")):
    m = energy.EnergyMeter(torch.device("cuda", 0))
    for name in marks:
        m.mark(name)
    return m


def test_the_timed_window_gives_joules_per_gpu_and_per_image(monkeypatch):
    # GPU 0 trains (its allocations grow); GPU 1 is visible but idle: not this run's
    fake_gpus(monkeypatch, {0: [100.0, 150.0, 450.0], 1: [7.0, 8.0, 9.0]}, {0: [10, 50, 90], 1: [0, 0, 0]})
    f = energy.fields(meter_at(), DistEnv(), images_timed=600)
    assert (f["gpus"], f["energy_per_gpu_j"], f["energy_j"]) == (1, [300.0], 300.0)
    assert f["joules_per_image"] == pytest.approx(0.5) and f["energy_loop_j"] == pytest.approx(350.0)
    assert f["energy_note"] is None and f["loop_s"] > 0


def test_a_data_parallel_run_counts_every_gpu_it_allocated_on(monkeypatch):
    fake_gpus(monkeypatch, {0: [0.0, 10.0, 110.0], 1: [0.0, 5.0, 65.0]}, {0: [1, 5, 9], 1: [0, 4, 8]})
    f = energy.fields(meter_at(), DistEnv(), images_timed=100)
    assert (f["gpus"], f["energy_per_gpu_j"], f["energy_j"]) == (2, [100.0, 60.0], 160.0)


def test_a_gpu_without_a_counter_gives_null_energy_with_the_reason(monkeypatch):
    def no_counter(i):
        raise energy.NoCounter("NVML has no energy counter for Tesla P100 (Not Supported): before Volta, or a MIG slice")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(energy, "read_mj", no_counter)
    f = energy.fields(meter_at(), DistEnv(), images_timed=100)
    assert f["energy_j"] is None and f["joules_per_image"] is None and "before Volta" in f["energy_note"]
    assert f["gpus"] == 1  # still one GPU-hour per GPU-hour


def ledger_results(tmp_path):
    from test_scaling import result

    for name, gpus, wall, joules in (("a/1gpu", 1, 3600.0, 3.6e5), ("a/4gpu", 4, 1200.0, None)):
        r = result(gpus)
        fields = {k: r.get(k) for k in Result.__dataclass_fields__}
        Result(**{**fields, "data_wait_ms": 0.0, "peak_memory_mb": None, "param_checksums": [],
                  "resumed_from_step": None, "torch_version": "2.14.1", "wall_time_s": wall, "gpus": gpus,
                  "energy_j": joules, "joules_per_image": None if joules is None else joules / 1e6,
                  "energy_note": None if joules else "no NVML library"}).save(
            (tmp_path / name).mkdir(parents=True) or tmp_path / name)
    return scaling.ledger(tmp_path)


def test_the_ledger_shows_gpu_hours_and_energy_columns(tmp_path):
    rows = ledger_results(tmp_path)
    table = scaling.markdown_table(rows).splitlines()
    assert table[0].endswith("| gpu_hours | energy_kj | j_per_image | gpu_hours_to_target | kwh_to_target |")
    assert table[2].endswith("| 1 | 360 | 0.36 | - | - |")  # 1 GPU x 1 h; 360 kJ over 1e6 images
    assert table[3].endswith("| 1.333 | - | - | - | - |")  # 4 GPUs x 20 min; no energy counter: "-", not None
    assert "cost" not in table[0]  # no site named: no cost column


def test_a_site_with_a_charge_per_gpu_hour_adds_the_cost_in_its_unit(tmp_path):
    rows = ledger_results(tmp_path)
    site = sites.Site(**{**sites.load_site("generic").__dict__, "charge_per_gpu_hour": 2.5, "charge_unit": "EUR"})
    table = scaling.markdown_table(rows, site=site).splitlines()
    assert table[0].endswith("| cost (EUR) |") and table[2].endswith("| 2.5 |") and table[3].endswith("| 3.333 |")
    lines = list(csv.DictReader(scaling.write_csv(rows, tmp_path / "ledger.csv", site=site).open()))
    assert [(l["cost"], l["cost_unit"]) for l in lines] == [("2.5", "EUR"), ("3.3333", "EUR")]


@pytest.mark.parametrize("line,message", [("charge_per_gpu_hour: -1", "must be a number >= 0"),
                                          ("charge_per_gpu_hour: lots", "must be a number >= 0"),
                                          ("charge_unit: ''", "must be text")])
def test_a_site_charge_is_checked_with_the_fix(tmp_path, line, message):
    text = (sites.SITES_DIR / "generic.yaml").read_text() + f"charge_per_gpu_hour: 1.5\n{line}\n"
    (tmp_path / "mine.yaml").write_text(text.replace("charge_per_gpu_hour: 1.5\n", "")
                                        if line.startswith("charge_per_gpu_hour") else text)
    with pytest.raises(UserError, match=message):
        sites.load_site(str(tmp_path / "mine.yaml"))


def test_site_profiles_without_a_charge_still_load():
    assert all(sites.load_site(name).charge_per_gpu_hour is None for name in sites.site_names())


def test_the_counter_is_checked_against_the_gpu_monitors_power_samples(tmp_path):
    """What the GPU node check does: the job monitor's power.draw (nvidia-smi's CSV, units and all) integrated
    over the result's timed window, beside the counter's joules."""
    import time as clock

    start = 1_800_000_000.0
    lines = ["timestamp, index, name, utilization.gpu [%], utilization.memory [%], memory.used [MiB], "
             "memory.total [MiB], power.draw [W]"]
    for k in range(-2, 14):  # a sample a second, 300 W on GPU 0 and 100 W on GPU 1 (idle: not this run's)
        stamp = clock.strftime("%Y/%m/%d %H:%M:%S", clock.localtime(start + k)) + ".000"
        lines += [f"{stamp}, 0, NVIDIA H100, 99 %, 40 %, 9000 MiB, 81559 MiB, 300.00 W",
                  f"{stamp}, 1, NVIDIA H100, 0 %, 0 %, 0 MiB, 81559 MiB, [N/A]"]
    (tmp_path / "gpu_monitor.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "result.json").write_text(json.dumps({"energy_per_gpu_j": [2940.0], "energy_note": None,
                                                      "energy_window_unix": [start + 0.5, start + 10.5]}))
    [row] = energy.against_monitor(str(tmp_path))
    assert row["power_draw_j"] == pytest.approx(3000.0) and row["ratio"] == pytest.approx(0.98)
    (tmp_path / "result.json").write_text(json.dumps({"energy_per_gpu_j": None, "energy_note": "no GPU: a CPU run",
                                                      "energy_window_unix": [1.0, 2.0]}))
    with pytest.raises(energy.NoCounter, match="no GPU"):
        energy.against_monitor(str(tmp_path))


def test_integration_follows_the_line_between_samples():
    samples = [(0.0, 100.0), (2.0, 300.0), (4.0, 300.0)]
    assert energy.integrate(samples, 1.0, 4.0) == pytest.approx(250 * 1 + 300 * 2)  # 200..300 W, then 300 W
    assert energy.integrate(samples, 1.0, 3.0) is None  # one sample inside the window: too few
