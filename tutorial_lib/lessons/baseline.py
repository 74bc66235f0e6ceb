"""One configuration, one number: why the fp32 baseline step of notebook 01 can read differently in 01, 02 and 04
on one card, measured in one process (the autotuner-off cases in a fresh one) so that only the thing varied differs.

    python -m tutorial_lib study baseline --reference     # about 2 minutes on an H100: 01_baseline_check.json
    python -m tutorial_lib study baseline --small         # the same steps with CPU sizes (tests)

The same fp32 step (configs/baseline.yaml: CIFAR-stem ResNet-18, batch 256, TF32 off) is timed
  - by hand, as notebook 01's section 2 does, with cuDNN's autotuner on (as the engine runs); and in a fresh
    process with the autotuner off (PyTorch's default), then on again in that process. PyTorch keeps the
    algorithm it chose for each convolution shape for the rest of the thread, whatever
    torch.backends.cudnn.benchmark says later, so a process whose first convolutions ran with the autotuner
    off keeps their untuned algorithms: the last figure shows what that costs;
  - in the engine for 60 steps (notebook 02's unprofiled run), for 150 timed steps without TensorBoard
    (notebook 04's fp32 rung) and for the baseline's 1,500 steps (notebook 01), the last in windows of 100
    steps beside the GPU's clock, power and temperature (NVML, once a second), to see whether a long run
    slows down as the card heats up.
"""
from __future__ import annotations

import contextlib
import io
import multiprocessing
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import data, engine, models, nvml
from ..config import ROOT, TrainConfig, load


def by_hand(cfg: TrainConfig, benchmark: bool, steps: int) -> float:
    """Median ms of `steps` synchronised steps of notebook 01's hand-written loop on one batch (3 warm-up)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with engine.backend_flags():
        engine.set_precision_flags(cfg)
        torch.backends.cudnn.benchmark = benchmark
        model = models.build(cfg.model, 10).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        x, y = next(iter(data.build_loader(cfg.replace(num_workers=0), "train")))
        x, y = data.normalize(x.to(device), cfg.dataset), y.to(device)
        times = []
        for i in range(3 + steps):
            t0 = time.perf_counter()
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            if i >= 3:
                times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times)


def untuned_first(cfg: TrainConfig, steps: int) -> tuple[float, float]:
    """by_hand with the autotuner off, then on, in this process (run it in a fresh one): the second figure is
    the step whose convolutions kept the algorithms chosen while the autotuner was off."""
    return by_hand(cfg, False, steps), by_hand(cfg, True, steps)


def engine_run(cfg: TrainConfig, window: int) -> dict:
    """The engine's figures for `cfg`, and the time of each window of `window` timed steps (ms per step)."""
    with engine.prepared_run(cfg) as run, contextlib.redirect_stdout(io.StringIO()):
        result = run.fit()
        windows = [1000 * s / window for s in run.clock.window_seconds(window)]
        per_epoch = run.steps_per_epoch
    t = result.step_time_ms
    first = cfg.timing_warmup  # the step each window starts at: windows count timed steps only
    new_epoch = [w for w in range(len(windows))  # windows whose steps begin a new pass over the loader
                 if any(s % per_epoch == 0 for s in range(first + w * window, first + (w + 1) * window))]
    return {"img_s": result.throughput_img_s, "median_ms": t["median"], "p10_ms": t["p10"], "p90_ms": t["p90"],
            "steps": result.steps, "window_ms": windows, "new_epoch_windows": new_epoch, "device": result.device}


def study(size, out: Path) -> dict[str, dict]:
    """`python -m tutorial_lib study baseline`: the figures of 01_baseline_check (see the module's docstring)."""
    base = load(ROOT / "configs" / "baseline.yaml").replace(
        tensorboard=False, progress=False, resume=False, eval=False)
    if size.small:
        base = base.replace(model="resnet18_imagenet", batch_size=8, train_size=48, num_workers=0)  # 6 steps an epoch
    hand_steps, short, rung, long_, window = size.pick((2, 5, 6, 8, 2), (30, 60, 160, 1500, 100))
    warm = size.pick(2, 10)  # untimed steps (notebook 02's run: 5)
    figures = {"batch": base.batch_size, "by_hand_benchmark_on_ms": by_hand(base, True, hand_steps)}
    with multiprocessing.get_context("spawn").Pool(1) as fresh:  # its own cuDNN algorithm cache
        off, on_after = fresh.apply(untuned_first, (base, hand_steps))
    figures.update(by_hand_benchmark_off_ms=off, by_hand_benchmark_on_after_off_ms=on_after)
    runs = {"engine_60": base.replace(steps=short, timing_warmup=min(5, warm)),
            "engine_rung": base.replace(steps=rung, timing_warmup=warm, optimizer_impl="foreach"),
            "engine_long": base.replace(steps=long_, timing_warmup=warm, tensorboard=True)}
    for name, cfg in runs.items():
        with nvml.Sampler([0], every_s=1.0) as gpu:  # NVML's GPU 0, once a second
            t0 = time.perf_counter()
            got = engine_run(cfg.replace(out_dir=str(out / name)),
                             window if name == "engine_long" else size.pick(2, 10))
        figures.update({f"{name}_{k}": v for k, v in got.items() if k != "device"})
        figures["device"] = got["device"]
        # the clock, power and temperature over the run: its first and last tenth
        figures.update({f"{name}_{k}": v for k, v in nvml.start_and_end(gpu.samples).items()})
        if gpu.note and got["device"].startswith("cuda"):
            figures[f"{name}_gpu_note"] = gpu.note  # a GPU run without NVML: no clock, power or temperature
        figures[f"{name}_wall_s"] = time.perf_counter() - t0
    return {"01_baseline_check": figures}
