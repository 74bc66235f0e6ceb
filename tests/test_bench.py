"""bench: IO / SYNTHETIC / FULL are measured, consistent, and the verdict names what bounds the run.

The slow input and the heavy model sleep rather than compute, so their cost holds on a busy 2-core CPU."""
import json
import os
import subprocess
import sys
import time

import pytest
import torch

from conftest import SleepyNet
from tutorial_lib import bench, data, models
from tutorial_lib.__main__ import main
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
    assert full <= 1.25 * min(io_, syn), r.summary()  # FULL can't beat the slower of its two parts
    saved = json.loads((tmp_path / "run" / "bench.json").read_text())
    assert set(saved["figures"]) == set(bench.MEASURES) and saved["bound"] == r.bound
    assert saved["figures"]["full"]["windows"] == 4 and saved["device"].startswith("CPU")


def test_slow_input_is_input_bound(tiny_cfg, model_seconds, image_seconds):
    model_seconds(0.002)  # ~5,000 img/s
    image_seconds(0.004)  # 64 ms per batch of 16: 250 img/s, 20x slower than the step
    r = run_bench(tiny_cfg)
    assert r.bound == "input" and r.verdict.startswith("input-bound: FULL"), r.summary()
    assert r.img_s("full") < 0.5 * r.img_s("synthetic")
    assert "raise num_workers (now 0" in r.verdict


def test_heavy_model_is_compute_bound(tiny_cfg, model_seconds):
    model_seconds(0.08)  # 200 img/s; the input gives thousands
    r = run_bench(tiny_cfg)
    assert r.bound == "compute" and r.verdict.startswith("compute-bound: FULL"), r.summary()
    assert r.img_s("full") <= 1.25 * r.img_s("synthetic")
    assert "on a CPU the step is the limit" in r.verdict


def fig(measure, img_s, spread=0.0):
    return Measurement(measure, img_s, img_s * (1 - spread), img_s * (1 + spread), 4, 10, 0, [img_s])


@pytest.mark.parametrize("io_, syn, full, cfg_kw, expected", [
    (9_300, 41_000, 9_100, dict(num_workers=2), ["input-bound: FULL 9,100 (±0%) ≈ IO 9,300 (±0%) < SYNTHETIC "
                                                 "41,000 (±0%) img/s", "loader=gpu_resident",
                                                 "raise num_workers (now 2; you have 8 CPUs"]),
    (9_300, 41_000, 9_100, dict(num_workers=7), ["ask for more CPUs per task: num_workers=7 already uses your 8"]),
    (9_300, 41_000, 9_100, dict(), ["ask for more CPUs per task: num_workers=7 already uses your 8"]),  # auto: 8 - 1
    (90_000, 9_000, 8_900, dict(precision="fp32"), ["compute-bound: FULL 8,900 (±0%) ≈ SYNTHETIC 9,000 (±0%) < IO "
                                                    "90,000", "precision=bf16"]),
    (90_000, 30_000, 29_000, dict(precision="bf16", channels_last=True),
     ["one CUDA graph: cuda_graph=true", "larger batch_size (now 128"]),
    (90_000, 30_000, 29_000, dict(precision="bf16", channels_last=True, cuda_graph=True),
     ["a larger batch_size (now 128", "more GPUs"]),
    (90_000, 30_000, 29_000, dict(precision="bf16", channels_last=True, compile=True, compile_mode="reduce-overhead"),
     ["a larger batch_size (now 128", "more GPUs"]),
    # notebook 03 on an H200 with loader=gpu_resident: FULL 0.77 of SYNTHETIC while IO is far above both
    (120_000, 39_500, 30_455, dict(precision="bf16", channels_last=True, loader="gpu_resident", batch_size=256),
     ["host/launch-bound: FULL 30,455 (±0%) is 23% below SYNTHETIC 39,500 (±0%) img/s while IO 120,000 (±0%) keeps up",
      "one CUDA graph: cuda_graph=true", "larger batch_size (now 256"]),
    (20_000, 21_000, 12_000, dict(num_workers=7), ["host/launch-bound: FULL 12,000 (±0%) is 43% below SYNTHETIC",
                                                   "7 workers and the training loop share 8 CPUs: try fewer workers"]),
])
def test_verdict_names_the_bound_and_the_knob(monkeypatch, io_, syn, full, cfg_kw, expected):
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "8")
    figures = {"io": fig("io", io_), "synthetic": fig("synthetic", syn), "full": fig("full", full)}
    bound, text = bench.verdict(figures, data.TrainConfig(**cfg_kw), "cuda")
    for words in expected:
        assert words in text, text
    assert (bound == "launch") == text.startswith("host/launch-bound")
    if full < 0.8 * syn:
        assert bound != "compute", text  # a FULL well below SYNTHETIC is never called compute-bound
    assert "compile=true:" not in text and not text.rstrip(")").endswith("compile=true")  # never plain compile


def test_verdict_shows_each_figures_window_spread():
    figures = {"io": fig("io", 9_300, 0.05), "synthetic": fig("synthetic", 41_000, 0.2), "full": fig("full", 9_100)}
    _, text = bench.verdict(figures, data.TrainConfig(num_workers=0), "cpu")
    assert "IO 9,300 (±5%)" in text and "SYNTHETIC 41,000 (±20%)" in text
    line = figures["io"].line("CPU", 1)
    assert "(windows 8,835-9,765, 4 x 10 steps, 1 rank)" in line


def test_bad_bench_options_are_one_line_errors(capsys):
    assert main(["bench", "--measures", "io,speed"]) == 2
    assert "measures=['io', 'speed']: choose from io, synthetic, full" in capsys.readouterr().err
    assert main(["bench", "--steps", "0"]) == 2


def test_ddp_bench_on_two_ranks_reports_the_slowest(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "tutorial_lib",
           "bench", "parallel=ddp", "model=resnet18_imagenet", "batch_size=8", "train_size=128", "device=cpu",
           "num_workers=0", "tensorboard=false", f"out_dir={tmp_path}", "--steps=4", "--window=2", "--warmup=1"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    lines = p.stdout.splitlines()
    assert [l.split()[0] for l in lines[:4]] == ["IO", "SYNTHETIC", "FULL", "verdict:"]  # printed once, by rank 0
    assert "slowest of 2 ranks" in lines[0] and " img/s " in lines[0]
    r = json.loads((tmp_path / "bench.json").read_text())
    for f in r["figures"].values():
        assert len(f["per_rank_img_s"]) == 2
        assert f["img_s"] == pytest.approx(2 * min(f["per_rank_img_s"]))  # the job moves at its slowest rank's pace
