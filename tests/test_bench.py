"""bench: IO / SYNTHETIC / FULL are measured, consistent, and the verdict names what bounds the run.

The slow input and the heavy model sleep rather than compute, so their cost holds on a busy 2-core CPU."""
import dataclasses
import json
import time
from pathlib import Path

import pytest
import torch

from conftest import SleepyNet
from tutorial_lib import bench, data, models
from tutorial_lib.__main__ import main
from tutorial_lib.lessons import data_loading, noise, size, studies
from tutorial_lib.lessons.bench import Measurement


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


@pytest.fixture
def model_seconds(monkeypatch):
    def use(seconds):
        monkeypatch.setattr(models, "build", lambda name, num_classes: SleepyNet(num_classes, seconds))
    return use


@pytest.fixture
def image_seconds(monkeypatch):
    def use(seconds):
        load = data.ImageDataset.__getitem__

        def slow(self, key):
            time.sleep(seconds)
            return load(self, key)
        monkeypatch.setattr(data.ImageDataset, "__getitem__", slow)
    return use


def run_bench(tiny_cfg, **kw):
    return bench.bench(tiny_cfg(batch_size=16, train_size=256), steps=8, window=2, warmup=1, **kw)


def test_three_figures_positive_and_full_not_above_the_slower_side(tiny_cfg, model_seconds, tmp_path):
    model_seconds(0.02)  # the step: ~800 img/s at batch 16; loading 16 shapes images takes ~2 ms
    r = run_bench(tiny_cfg)
    io_, syn, full = (r.img_s(m) for m in bench.MEASURES)
    assert min(io_, syn, full) > 0
    # FULL can't beat the slower of its two parts: against each part's fastest window, the one a busy machine
    # disturbed least (another process's load slows single windows, and the figure with them)
    assert full <= 1.25 * min(r.figures[m].img_s_high for m in ("io", "synthetic")), r.summary()
    saved = json.loads((tmp_path / "run" / "bench.json").read_text())
    assert set(saved["figures"]) == set(bench.MEASURES) and saved["bound"] == r.bound
    assert saved["figures"]["full"]["windows"] == 4 and saved["device"].startswith("CPU")


def test_slow_input_is_input_bound(tiny_cfg, model_seconds, image_seconds):
    model_seconds(0.002)  # ~5,000 img/s
    image_seconds(0.004)  # 64 ms per batch of 16: 250 img/s, 20x slower than the step
    r = run_bench(tiny_cfg)
    assert r.bound == "input" and r.verdict.startswith("input-bound: IO/SYNTHETIC x0."), r.summary()
    assert r.img_s("full") < 0.5 * r.img_s("synthetic")
    assert "num_workers above 0" in r.verdict


def test_heavy_model_is_step_bound(tiny_cfg, model_seconds):
    model_seconds(0.2)  # 80 img/s; the input gives thousands, and loading a batch takes a few ms of a step's 200
    r = bench.bench(tiny_cfg(batch_size=16, train_size=256), steps=16, window=2, warmup=1)  # 8 windows: settled
    # a busy 2-core machine can leave FULL against SYNTHETIC not settled; never input, contended or compute
    assert r.bound in ("step", "not settled"), r.summary()
    assert r.img_s("full") <= 1.25 * r.figures["synthetic"].img_s_high, r.summary()  # its fastest window: see above
    if r.bound == "step":  # a CPU: no trace, so the bench can tell only that the step is the limit
        assert r.verdict.startswith("step-bound: SYNTHETIC/IO x0.") and "on a CPU the step is the limit" in r.verdict
    else:
        assert "more windows would decide" in r.verdict or "raise --steps" in r.verdict


def fig(measure, img_s, spread=0.0):
    return Measurement(measure, img_s, img_s * (1 - spread), img_s * (1 + spread), 4, 10, 0, [img_s])


@pytest.mark.parametrize("io_, syn, full, cfg_kw, expected", [
    (9_300, 41_000, 9_100, dict(num_workers=2), ["input-bound: IO/SYNTHETIC x0.23", "loader=gpu_resident",
                                                 "or num_workers above 2 (8 CPUs)"]),
    (9_300, 41_000, 9_100, dict(num_workers=7), ["more CPUs (7 workers on 8)"]),
    (9_300, 41_000, 9_100, dict(), ["more CPUs (7 workers on 8)"]),  # auto: 8 - 1
    (90_000, 9_000, 8_900, dict(precision="fp32"), ["step-bound: SYNTHETIC/IO x0.10", "precision=bf16"]),
    (90_000, 30_000, 29_000, dict(precision="bf16", channels_last=True),
     ["cuda_graph=true (one launch a step)", "larger batch_size (now 128)"]),
    (90_000, 30_000, 29_000, dict(precision="bf16", channels_last=True, cuda_graph=True),
     ["a larger batch_size (now 128)", "more GPUs"]),
    (90_000, 30_000, 29_000, dict(precision="bf16", channels_last=True, compile=True, compile_mode="reduce-overhead"),
     ["a larger batch_size (now 128)", "more GPUs"]),
    # notebook 03 on an H200 with loader=gpu_resident: FULL 0.77 of SYNTHETIC while IO is far above both
    (120_000, 39_500, 30_455, dict(precision="bf16", channels_last=True, loader="gpu_resident", batch_size=256),
     ["contended: FULL/SYNTHETIC x0.77", "cuda_graph=true", "larger batch_size (now 256)"]),
    (20_500, 21_000, 12_000, dict(num_workers=7), ["contended: FULL/SYNTHETIC x0.57",
                                                   "fewer workers: 7 workers and the loop share 8 CPUs"]),
])
def test_verdict_names_the_bound_and_the_knob(monkeypatch, io_, syn, full, cfg_kw, expected):
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "8")
    monkeypatch.setattr(bench, "usable_cpus", lambda: 8)
    figures = {"io": fig("io", io_), "synthetic": fig("synthetic", syn), "full": fig("full", full)}
    bound, text = bench.verdict(figures, data.TrainConfig(**cfg_kw), "cuda")
    for words in expected:
        assert words in text, text
    lines = text.splitlines()
    assert len(lines) == 2 and all(len(x) <= 80 for x in lines) and lines[1].startswith("next: "), text
    if full < 0.8 * syn:
        assert bound not in ("step", "compute"), text  # a FULL well below SYNTHETIC is never the step's limit
    assert "compile=true:" not in text and not text.rstrip(")").endswith("compile=true")  # never plain compile


@pytest.mark.parametrize("workers, cpus", [(1, 2), (0, 2), (7, 8)])
def test_a_cpu_verdict_names_the_step_whatever_the_bound(monkeypatch, workers, cpus):
    """On a CPU the step runs on the cores the loading shares: a FULL below SYNTHETIC while IO keeps up (notebook
    03's pinned row on 2 CPUs) is the step's limit there, never advice to use fewer than one worker."""
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", str(cpus))
    figures = {"io": fig("io", 5_043, 0.3), "synthetic": fig("synthetic", 403, 0.01), "full": fig("full", 357, 0.03)}
    bound, text = bench.verdict(figures, data.TrainConfig(num_workers=workers), "cpu")
    assert bound == "contended" and text.startswith("contended: FULL/SYNTHETIC x0.89"), text
    assert text.endswith("on a CPU the step is the limit; measure again on a GPU") and "fewer workers" not in text
    assert "launch" not in text and "queuing" not in text  # no GPU kernels to queue


def test_a_figure_line_shows_the_interval_of_its_mean_and_its_windows():
    figures = {"io": fig("io", 9_300, 0.05), "synthetic": fig("synthetic", 41_000, 0.2), "full": fig("full", 9_100)}
    line = figures["io"].line("CPU", 1)
    assert line.startswith("IO             9,300 img/s ±") and "(windows 8,835-9,765, 4 x 10 steps, 1 rank)" in line
    assert "±" not in figures["full"].line("CPU", 1)  # one window's worth of spread: no interval of its own
    _, text = bench.verdict(figures, data.TrainConfig(num_workers=0), "cpu")
    assert text.startswith("input-bound: IO/SYNTHETIC x0.23 (")


def test_bad_bench_options_are_one_line_errors(capsys):
    assert main(["bench", "--measures", "io,speed"]) == 2
    assert "measures=['io', 'speed']: choose from io, synthetic, full" in capsys.readouterr().err
    assert main(["bench", "--steps", "0"]) == 2


def test_full_trains_with_the_learning_rates_of_a_fresh_run(tiny_cfg):
    """SYNTHETIC's steps advance the schedule; the engine's restart_schedule puts FULL back at the first step's
    rate, in the optimizer itself (a float, or the tensor a recorded CUDA-graph step reads)."""
    from tutorial_lib import distributed, engine, stepgraph

    run = engine.Run(tiny_cfg(lr=0.01, warmup_steps=4, steps=8), distributed.setup("none", "cpu"))
    first = run.opt.param_groups[0]["lr"]
    assert first == pytest.approx(0.01 / 4)  # warm-up: step 1 of 4
    x, y = run.prepare(*next(iter(run.input.epoch(0, 0))))
    for _ in range(3):
        run.train_step(x, y)
    assert run.opt.param_groups[0]["lr"] == pytest.approx(0.01)
    run.restart_schedule()
    assert run.opt.param_groups[0]["lr"] == pytest.approx(first) and run.sched.last_epoch == 0
    run.opt = torch.optim.AdamW(run.raw_model.parameters(), lr=0.01)  # as cuda_graph=true makes it: the rate
    stepgraph.tensor_lr(run.opt)  # lives in a tensor the recorded step reads
    run.restart_schedule()
    for _ in range(3):
        run.opt.step()  # no gradients: nothing moves, as the scheduler expects a step before its own
        run.sched.step()
    rate = run.opt.param_groups[0]["lr"]
    run.restart_schedule()
    assert run.opt.param_groups[0]["lr"] is rate and float(rate) == pytest.approx(first)  # the same tensor, refilled


def test_the_data_loading_study_benches_every_loader_and_two_ranks(tmp_path, capsys):
    """`python -m tutorial_lib study data_loading --small` (scripts/gpu/data_loading.sh on a GPU): each loader's
    IO / SYNTHETIC / FULL, the table with the gpu_resident check, and the bench under torchrun on 2 gloo ranks,
    where every rank measures and the job's figure is the slowest rank's."""
    assert studies.run("data_loading", size.Size(True, "test"), tmp_path) == {}  # tables only, no reference record
    records = json.loads((tmp_path / "data_loading.json").read_text())
    assert [r["case"] for r in records] == ["b8 dataloader", "b8 prefetcher", "b8 imagefolder", "b8 gpu_resident"]
    for r in records:
        assert all(r["figures"][m]["img_s"] > 0 for m in bench.MEASURES) and r["bound"] and r["verdict"], r["case"]
    assert records[2]["config"]["dataset"] == "imagefolder" and records[3]["config"]["loader"] == "gpu_resident"
    table = (tmp_path / "data_loading.md").read_text()
    assert all(f"| {r['case']} |" in table for r in records) and "gpu_resident: the input is not the limit (FULL/SYNTHETIC b8 gpu_resident " in table
    ddp = json.loads((tmp_path / "runs" / "ddp2" / "bench.json").read_text())
    assert ddp["world_size"] == 2 and ddp["config"]["loader"] == "gpu_resident"
    for f in ddp["figures"].values():
        assert len(f["per_rank_img_s"]) == 2
        assert f["img_s"] == pytest.approx(2 * min(f["per_rank_img_s"]))  # the job moves at its slowest rank's pace
    out = capsys.readouterr().out
    assert out.count("slowest of 2 ranks") == 3  # IO, SYNTHETIC, FULL: printed once, by rank 0


def test_the_gpu_resident_check_asks_whether_the_input_is_still_the_limit():
    """On 2x H200 at batch 256 gpu_resident's FULL was 0.906 of SYNTHETIC: a real shortfall by the rule, but the
    host's, not the input's (IO far above both); the check fails only where a gpu_resident row is input-bound."""
    def rec(case, full, syn, io_=(900_000, 800_000, 1_000_000)):  # as the study stores them: each Measurement a dict
        return {"case": case, "device": "NVIDIA H200", "figures": {
            "io": dataclasses.asdict(windows("io", *io_)), "full": dataclasses.asdict(windows("full", *full)),
            "synthetic": dataclasses.asdict(windows("synthetic", *syn))}}
    noisy = rec("b256 gpu_resident", (21_870, 20_742, 23_154), (24_144, 21_500, 26_800))
    big = rec("b1024 gpu_resident", (66_399, 66_313, 66_458), (66_867, 66_800, 66_900))
    other = rec("b256 dataloader", (10_000, 9_000, 11_000), (24_144, 21_500, 26_800), (10_500, 9_500, 11_500))
    line = data_loading.check_line([noisy, big, other])
    assert line.startswith("gpu_resident: the input is not the limit (FULL/SYNTHETIC b256 gpu_resident x0.91 (")
    assert line.endswith("): PASS") and "b256 dataloader" not in line  # the dataloader row reads files: not checked
    slow = rec("b256 gpu_resident", (18_000, 17_500, 18_500), (24_144, 21_500, 26_800), (18_500, 18_000, 19_000))
    assert data_loading.check_line([slow, big]).endswith("FAIL: input-bound in b256 gpu_resident")


def windows(measure, img_s, low, high):
    return Measurement(measure, img_s, low, high, 10, 20, 0, [img_s])


def test_the_loader_keeps_up_only_when_io_stays_above_synthetic_in_every_window():
    """Notebook 03's GPU summary (data_loading.keeps_up): the H100's prefetcher row, FULL x0.90 of SYNTHETIC with an
    interval that holds 1, while IO's slowest window delivers half of SYNTHETIC: the sentence says both."""
    syn = windows("synthetic", 30_902, 26_427, 36_648)
    row = {"io": windows("io", 58_754, 16_691, 110_813), "synthetic": syn, "full": windows("full", 27_727, 14_930, 32_437)}
    text = data_loading.keeps_up(row)
    assert bench.bound(row) == "not settled" and "keeps up on this card" not in text, text
    assert text.startswith("IO's slowest window (16,691 img/s) is below SYNTHETIC (30,902)"), text
    assert "FULL/SYNTHETIC x0.90 (0.71-1.14)" in text and "±" not in text and "<" not in text
    steady = {**row, "io": windows("io", 58_754, 31_000, 110_813)}
    assert data_loading.keeps_up(steady).endswith("the loader keeps up on this card at this batch.")
    bursty = {**row, "full": windows("full", 20_689, 9_444, 25_000)}
    assert bench.bound(bursty) == "bursts" and "delivers in bursts" in data_loading.keeps_up(bursty)
    host = {**bursty, "io": windows("io", 58_754, 31_000, 110_813)}
    assert bench.bound(host) == "contended" and "the input and the step slow each other" in data_loading.keeps_up(host)


def test_notebook_03_says_keeps_up_only_beside_a_reference_row_that_keeps_up():
    """The committed notebook prints the reference's best CPU pipeline: 'keeps up' in every window only when that
    row's IO stays above SYNTHETIC in every window."""
    from tutorial_lib import reference

    nb = json.loads((Path(__file__).parents[1] / "notebooks" / "03_data_loading.ipynb").read_text())
    text = "".join("".join(o.get("text", "")) for c in nb["cells"] if c["cell_type"] == "code"
                   for o in c.get("outputs", []))
    line = next(x for x in text.splitlines() if x.startswith("- Highest FULL of the CPU pipelines"))
    f = reference.load("03_loader_ladder")["figures"]
    best = max(["workers", "pinned", "prefetcher"], key=lambda k: f[k + "_full"])
    syn = bench.figure(bench.from_reference(f, best)["synthetic"])  # SYNTHETIC's mean, as the verdicts judge it
    dips = noise.compare(noise.Figure.of(f[best + "_io_low"]), syn).verdict == "lower"
    # lessons/data_loading.keeps_up's two claims that IO never fell below SYNTHETIC ('on average' admits a dip)
    claims = "keeps up on this card" in line or "keeps up in every window" in line
    assert claims == (not dips), line


def test_bursty_input_is_input_bound_not_launch_bound():
    """03 on an H100, 8 workers: IO's mean is above SYNTHETIC but its slowest window is far below it, and FULL
    falls between: the step waits for batches in the slow windows (not the host launching kernels)."""
    figures = {"io": windows("io", 50_497, 13_338, 98_699), "synthetic": windows("synthetic", 34_772, 31_831, 36_504),
               "full": windows("full", 20_689, 9_444, 30_335)}
    kind, text = bench.verdict(figures, data.TrainConfig(num_workers=8), "cuda")
    assert kind == "bursts" and text.startswith("input-bound in bursts: FULL/SYNTHETIC x0.59 ("), text
    steady = {**figures, "io": windows("io", 50_497, 45_000, 56_000)}  # the same mean, every window above SYNTHETIC
    assert bench.bound(steady) == "contended"


def test_full_above_synthetic_is_flagged_only_beyond_the_interval():
    io_ = windows("io", 730_422, 299_233, 896_188)
    syn = windows("synthetic", 32_179, 27_497, 37_596)
    kind, text = bench.verdict({"io": io_, "synthetic": syn, "full": windows("full", 33_014, 28_252, 36_078)},
                               data.TrainConfig(loader="gpu_resident"), "cuda")
    assert kind == "not settled" and "FULL/SYNTHETIC x1.03 (0.94-1.11)" in text and "more windows would decide" in text
    kind, text = bench.verdict({"io": io_, "synthetic": syn, "full": windows("full", 48_000, 47_000, 49_000)},
                               data.TrainConfig(loader="gpu_resident"), "cuda")
    assert kind == "disagrees" and text.startswith("measurement disagrees: FULL/SYNTHETIC x1.49") and "rerun" in text


def test_a_verdict_can_be_judged_again_from_a_reference_row():
    f = {"w_io": 9_000.0, "w_io_low": 8_000.0, "w_io_high": 10_000.0, "w_synthetic": 30_000.0,
         "w_synthetic_low": 29_000.0, "w_synthetic_high": 31_000.0, "w_full": 8_800.0, "w_full_low": 8_000.0,
         "w_full_high": 9_500.0}
    figures = bench.from_reference(f, "w")
    assert set(figures) == set(bench.MEASURES) and figures["io"].img_s_low == 8_000.0 and figures["io"].windows == 10
    assert bench.bound(figures) == "input"


def test_a_rate_below_100_img_s_keeps_a_decimal():
    """A large model on a CPU benches at a few samples/s: '2 > 1' said nothing a learner could check."""
    figures = {"io": fig("io", 5_000.0, 0.1), "synthetic": fig("synthetic", 1.43, 0.01), "full": fig("full", 1.38)}
    _, text = bench.verdict(figures, data.TrainConfig(num_workers=0), "cpu")
    assert text.startswith("step-bound: SYNTHETIC/IO x0.00029 ("), text
    assert "SYNTHETIC        1.4 img/s ±2%   (windows 1.4-1.4," in figures["synthetic"].line("CPU", 1)


def test_outside_a_slurm_job_the_knob_speaks_of_this_process_not_a_task(monkeypatch):
    """A GPU node without Slurm (notebook 03 on a lent H200) has no task: 'you have 16 CPUs per task' was wrong."""
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    monkeypatch.setattr(bench, "usable_cpus", lambda: 16)
    assert bench.input_knob(data.TrainConfig(num_workers=8), "cpu") == "num_workers above 8 (16 CPUs)"
    assert bench.input_knob(data.TrainConfig(num_workers=15), "cpu") == \
        "more CPUs (Slurm: --cpus-per-task; 15 workers on 16)"
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "16")
    assert bench.input_knob(data.TrainConfig(num_workers=8), "cpu") == "num_workers above 8 (16 CPUs per task)"
    assert bench.input_knob(data.TrainConfig(num_workers=15), "cpu") == "more CPUs (15 workers on 16)"


def test_a_loader_that_stalls_the_step_is_input_bound_even_when_the_stalls_widen_fulls_band():
    """Notebook 03 on one H200, 8 workers: FULL averaged 13,609 (31% of its time waiting for batches), below
    every window of SYNTHETIC (18,330-23,182), and IO's slowest window delivered 8,382. It was called compute-bound
    with 'the batches the loader had queued bridged it this time'."""
    figures = {"io": windows("io", 30_895, 8_382, 56_504), "synthetic": windows("synthetic", 20_629, 18_330, 23_182),
               "full": windows("full", 13_609, 5_157, 19_071)}
    # ten windows that wide leave FULL against SYNTHETIC not settled; the wait the bench measured beside FULL decides
    assert bench.bound(figures) == "not settled"
    kind, text = bench.verdict(figures, data.TrainConfig(num_workers=8), "cuda", waited=0.31)
    assert kind == "input" and text.startswith("input-bound: waited for data 31% of the time, FULL/SYNTHETIC"), text
    assert "bridged" not in text and "compute" not in text
    # the same FULL with a loader that never dips below SYNTHETIC, FULL reaching it: the step is the limit
    figures["io"] = windows("io", 30_895, 25_000, 56_504)
    figures["synthetic"] = windows("synthetic", 20_629, 20_000, 21_300)
    figures["full"] = windows("full", 20_000, 19_000, 21_000)
    assert bench.bound(figures) == "step"


H200_BURSTS = {"io": windows("io", 31_856, 9_327, 56_279), "synthetic": windows("synthetic", 18_673, 17_389, 21_154),
               "full": windows("full", 12_179, 5_344, 15_500)}


def test_a_bursty_loader_is_told_to_steady_its_delivery_before_more_workers(monkeypatch):
    """Notebook 03 on one H200, 8 workers without pinning or persistent workers: input-bound in bursts (FULL 12,179,
    waiting 5.7 ms a step), and the verdict said only 'raise num_workers (now 8 ...)'; the next row, the same 8
    workers pinned and persistent, reached FULL 17,441 (1.0 ms), while 4 -> 8 workers had raised FULL by 3%."""
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    monkeypatch.setattr(bench, "usable_cpus", lambda: 16)
    cfg = data.TrainConfig(num_workers=8, pin_memory=False, persistent_workers=False)
    kind, text = bench.verdict(H200_BURSTS, cfg, "cuda")
    assert kind == "bursts" and text.startswith("input-bound in bursts"), text
    assert text.splitlines()[1] == "next: steady the delivery first: persistent_workers=true pin_memory=true"
    # on a CPU nothing is pinned: only the persistent workers come first
    cpu = bench.verdict(H200_BURSTS, cfg, "cpu")[1].splitlines()[1]
    assert "persistent_workers=true" in cpu and "pin_memory" not in cpu, cpu
    # a config that has both already: the input knob alone
    steady = bench.verdict(H200_BURSTS, cfg.replace(pin_memory=True, persistent_workers=True), "cuda")[1]
    assert "steady" not in steady and "num_workers above 8 (16 CPUs)" in steady, steady
    # a loader that is input-bound on average (not in bursts) keeps the input knob alone
    slow = {**H200_BURSTS, "io": windows("io", 9_000, 8_000, 10_000)}
    assert "steady" not in bench.verdict(slow, cfg, "cuda")[1]


def test_the_bound_column_says_in_bursts_where_the_verdict_does():
    """Notebook 03's tables printed 'input' beside a verdict 'input-bound in bursts' (IO 31,856 > SYNTHETIC 18,673)."""
    assert bench.bound_label(H200_BURSTS) == "input-bound in bursts"
    assert bench.bound_label({**H200_BURSTS, "io": windows("io", 9_000, 8_000, 10_000)}) == "input-bound"
    steady = {**H200_BURSTS, "io": windows("io", 45_710, 33_493, 58_033), "full": windows("full", 18_441, 17_967, 19_480)}
    assert bench.bound_label(steady) == "step-bound" and bench.bound(steady) == "step"
    assert bench.bound_label({"io": H200_BURSTS["io"], "full": H200_BURSTS["full"]}) is None


def test_the_dataset_size_is_said_in_mib_as_it_is_computed():
    """dataset_mb divides by 2**20: the knob said '146 MB of images' for 153.6 million bytes."""
    cfg = data.TrainConfig(train_size=None)
    assert round(bench.dataset_mb(cfg)) == 146 and 50_000 * 3 * 32 * 32 == 153_600_000
    assert "loader=gpu_resident (146 MiB of images)" in bench.input_knob(cfg, "cuda")
