"""Precision, in one place (notebook 04 teaches it): TF32 flags, the autocast context, the fp16 GradScaler and
its skipped steps, the cuDNN autotuner choice, and restoring the backend flags after a run.

fp32: every matmul and convolution in float32 (TF32 off: cuDNN convolutions use TF32 by default on Ampere
and newer, so an honest fp32 baseline turns it off); tf32: the same code on tensor cores with a 10-bit
mantissa; bf16 / fp16: autocast runs matmuls and convolutions in 16 bits, keeps reductions in float32;
fp16's narrow range needs a GradScaler (scale the loss, step, update the scale), bf16's does not.
On a CPU bf16 is fast only with bf16 instructions (AVX-512 BF16, AMX, Arm's BF16); with AVX2 alone oneDNN emulates
it, at many times fp32's time: cpu_bf16_slowdown measures which this CPU is.
"""
from __future__ import annotations

import functools
import time
from contextlib import contextmanager, nullcontext

import torch

from .config import TrainConfig


def set_precision_flags(cfg: TrainConfig) -> None:
    """TF32 on for precision=tf32, off otherwise (notebook 01 shows why, notebook 04 measures it)."""
    tf32 = cfg.precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def autocast(cfg: TrainConfig, device: torch.device):
    """The autocast context of the forward pass: bf16 or fp16 on the device, nothing for fp32/tf32."""
    if cfg.precision in ("bf16", "fp16"):
        dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float16
        return torch.autocast(device.type, dtype=dtype)
    return nullcontext()


def grad_scaler(cfg: TrainConfig, device: torch.device) -> torch.amp.GradScaler:
    """fp16 only: scales the loss so small gradients don't underflow; a no-op object otherwise."""
    return torch.amp.GradScaler(device.type, enabled=cfg.precision == "fp16")


class SkippedSteps:
    """fp16: the optimizer steps the GradScaler skipped. `scaler.step` skips the update when a gradient is
    inf/NaN, and `scaler.update()` then halves the scale; it never lowers the scale otherwise. So a step after
    which the scale went down was skipped. Counted on the device: nothing waits for the GPU."""

    def __init__(self):
        self.count = None  # a device tensor once a step with an enabled scaler was taken

    @staticmethod
    def scale_before(scaler):
        return scaler._scale.clone() if scaler.is_enabled() else None  # the scaler's scale lives in `_scale`

    def after_update(self, scaler, before) -> None:
        if before is not None:
            skipped = (scaler._scale < before).int()
            self.count = skipped if self.count is None else self.count + skipped

    def total(self) -> int | None:
        return None if self.count is None else int(self.count)


def set_cudnn_benchmark(cfg: TrainConfig) -> None:
    """cuDNN times its algorithms once per input shape: a win, except under DataParallel, whose replicas run in
    fresh threads each step and re-time every step; so it is off there unless cudnn_benchmark=force (notebook 05
    measures the trap)."""
    torch.backends.cudnn.benchmark = cfg.cudnn_benchmark == "force" or (cfg.cudnn_benchmark is True
                                                                       and cfg.parallel != "dp")


@contextmanager
def backend_flags():
    """Restore the torch.backends flags a run changes, so a run in a notebook leaves the kernel as it was."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    try:
        yield
    finally:
        (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
         torch.backends.cudnn.benchmark) = saved


CPU_BF16_EMULATED = 3.0  # a bf16 step this many times as long as the fp32 one: the CPU emulates bf16


@functools.lru_cache(maxsize=1)
def cpu_bf16_slowdown() -> float:
    """How many times as long a bf16-autocast training step of a small convolution and linear layer takes as its
    fp32 step on this CPU, at torch's current threads (the best of 3 after one warm-up each; about 0.1 s). Where
    the CPU has bf16 instructions it is about 1; an AVX2-only CPU took x7-x11 (ResNet-18: x25). Once a process."""
    conv, lin = torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.Linear(32 * 8 * 8, 10)
    x = torch.randn(4, 32, 32, 32)

    def step(bf16: bool) -> float:
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = lin(torch.nn.functional.avg_pool2d(conv(x), 4).flatten(1))
        out.float().sum().backward()
        return time.perf_counter() - start

    best = {}
    for bf16 in (False, True):
        step(bf16)
        best[bf16] = min(step(bf16) for _ in range(3))
    return best[True] / best[False]


def cpu_bf16_native() -> bool:
    """Whether bf16 autocast runs on this CPU at about fp32's pace (measured once: cpu_bf16_slowdown)."""
    return cpu_bf16_slowdown() < CPU_BF16_EMULATED


def cpu_bf16_note() -> str:
    """One line for a learner: why a CPU run uses fp32 where the lesson has bf16."""
    return (f"this CPU has no bf16 instructions: a bf16 step took x{cpu_bf16_slowdown():.0f} an fp32 one here, so "
            "the CPU runs use fp32; the reference shows bf16")
