"""Notebook 02's Nsight Systems job: it records the timed window only (torch.cuda.profiler start/stop with
--capture-range=cudaProfilerApi), traces the kernels inside CUDA graphs, and turns each report into text."""
from pathlib import Path

import torch

from tutorial_lib import engine, jobs, meters
from tutorial_lib.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


def test_the_nsys_job_captures_the_window_traces_graph_nodes_and_writes_stats(tmp_path):
    cfg = TrainConfig(model="resnet18", batch_size=256, steps=100, eval=False, nvtx=True)
    text = jobs.write("t_nsys", cfg, gpus_per_node=1, nsys=True, jobs_dir=tmp_path, show=False).read_text()
    line = next(x for x in text.splitlines() if "nsys profile" in x)
    assert "--capture-range=cudaProfilerApi" in line and "--capture-range-end=stop" in line
    assert "--cuda-graph-trace=node" in line
    stats = next(x for x in text.splitlines() if x.strip().startswith("nsys stats"))
    assert "--report nvtx_sum" in stats and "--report cuda_gpu_kern_sum" in stats
    assert '>"${report%.nsys-rep}.stats.txt"' in text  # the text beside its report
    assert "--capture-range=cudaProfilerApi" in (ROOT / "jobs" / "02_nsys.sbatch").read_text()  # re-rendered


def test_the_capture_range_starts_once_at_the_window_and_stops_once(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: calls.append("start"))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: calls.append("stop"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append("sync"))
    capture = meters.CaptureRange(True)
    capture.stop()  # never started: nothing to stop
    capture.start(), capture.start(), capture.stop(), capture.stop()
    assert calls == ["start", "sync", "stop"]
    off = meters.CaptureRange(False)
    off.start(), off.stop()
    assert calls == ["start", "sync", "stop"]
    assert not meters.StepClock(torch.device("cpu"), warmup=2, capture=True).capture.enabled  # no GPU: nothing


def test_the_training_asks_for_the_capture_when_nvtx_is_on(monkeypatch, tmp_path, tiny_cfg):
    seen = []

    class Clock(meters.StepClock):
        def __init__(self, *a, capture=False, **k):
            seen.append(capture)
            super().__init__(*a, capture=capture, **k)

    monkeypatch.setattr(engine, "StepClock", Clock)
    for nvtx in (True, False):
        engine.train(tiny_cfg(steps=2, eval=False, nvtx=nvtx, out_dir=tmp_path / str(nvtx)))
    assert seen == [True, False]
