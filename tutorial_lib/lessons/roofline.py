"""How far a profiled training step is from the card's roofs (notebook 04, docs/performance.md): the trace's
kernels in classes, the tensor-core class's FLOP/s against the card's peak and the normalisation class's bytes
against its memory bandwidth. The FLOPs are counted (torch.utils.flop_counter), the bytes bounded from below."""
from __future__ import annotations

import re

from ..config import TrainConfig

MFU_TARGET = 0.45  # notebook 04's issue: the optimized rung at >= 45% MFU


def pct(v) -> str:
    """A fraction as a whole percentage; n/a for None."""
    return "n/a" if v is None else f"{100 * v:.0f}%"


TENSOR_CORE = "tensor-core convolutions and matmuls"
NORM_CLASS = "BatchNorm, ReLU, add (fused Triton)"
# The fewest passes a training step makes over each BatchNorm's activations, with ReLU and the residual add fused
# in: forward reads them twice (statistics, then normalise) and writes once; backward reads the incoming gradient
# and the input twice (two reductions, then the gradient) and writes once. A lower bound of the bytes moved.
NORM_PASSES = 8
KERNEL_CLASSES = (  # (class, pattern of the kernel's name); the first match wins, Triton before the words it fuses
    (NORM_CLASS, r"^triton_"),
    ("communication (NCCL)", r"nccl"),
    ("optimizer", r"multi_tensor_apply|FusedOptimizer|fused_adam|adamw?_"),
    (TENSOR_CORE, r"xmma|gemm|cutlass|cudnn|conv|wgrad|dgrad|fprop|nvjet|^sm\d\d_"),
    ("copies and fills", r"^Memcpy|^Memset|copy_kernel|fill_kernel"),
    ("other ATen kernels", r""),
)


def kernel_classes(kernels: list[dict]) -> dict[str, float]:
    """ms per step of each KERNEL_CLASSES class, from a trace summary's kernels (name, ms per step)."""
    out: dict[str, float] = {}
    for k in kernels:
        cls = next(c for c, pattern in KERNEL_CLASSES if re.search(pattern, k["name"], re.I))
        out[cls] = out.get(cls, 0.0) + k["ms"]
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def roofline(cfg: TrainConfig, device: str, step_ms: float, kernels: list[dict]) -> dict:
    """How far the step is from the card's tensor-core peak, class by class: the model's FLOPs (all of them in
    convolutions and matmuls, as torch.utils.flop_counter counts them) over the time of the tensor-core kernels
    gives the rate those kernels reach; the other classes do no counted FLOPs and are bound by memory."""
    from .. import data, models, peaks

    classes = kernel_classes(kernels)
    channels, size, *_ = data.SPECS[cfg.dataset]
    shape = (data.num_classes(cfg.dataset), (channels, size, size))
    flops = models.flops_per_image(cfg.model, *shape) * cfg.batch_size
    peak, tc_ms = peaks.peak_tflops(device, cfg.precision), classes.get(TENSOR_CORE)
    out = {"classes_ms": classes, "flops_per_step": flops, "peak_tflops": peak}
    if peak and tc_ms and step_ms:
        out.update(tensor_core_tflops=flops / tc_ms / 1e9, step_tflops=flops / step_ms / 1e9)
    norm = NORM_CLASS if NORM_CLASS in classes else "other ATen kernels"  # compiled: fused by Triton; eager: ATen's
    if classes.get(norm) and peaks.bandwidth_tbs(device):
        size_of = 2 if cfg.precision in ("bf16", "fp16") else 4
        gb = models.norm_elements_per_image(cfg.model, *shape) * cfg.batch_size * size_of * NORM_PASSES / 1e9
        out.update(norm_class=norm, norm_gb_per_step=gb, norm_tbs=gb / classes[norm], bandwidth_tbs=peaks.bandwidth_tbs(device))
    return out


def roofline_lines(t: dict | None, name: str) -> list[str]:
    """The trace's kernel classes against the card's peak (`roofline`), as a table and the sentence it supports."""
    if not t or not t.get("tensor_core_tflops"):
        return []
    peak, step = t["peak_tflops"], t["step_ms"]
    out = ["", f"Kernel classes of rung {name} (batch {t['batch']}), against the card's dense peak of "
               f"{peak:,.0f} TFLOP/s for its precision:", "",
           "| kernel class | ms/step | of the step | achieved | of its roofline |", "|---|---|---|---|---|"]
    for cls, ms in t["classes_ms"].items():
        rate = ("no counted FLOPs", "memory-bound")
        if cls == TENSOR_CORE:
            rate = (f"{t['tensor_core_tflops']:,.0f} TFLOP/s", pct(t["tensor_core_tflops"] / peak))
        elif cls == t.get("norm_class"):
            rate = (f">= {t['norm_tbs']:.2f} TB/s ({t['norm_gb_per_step']:.1f} GB)",
                    f">= {pct(t['norm_tbs'] / t['bandwidth_tbs'])} of {t['bandwidth_tbs']:g} TB/s")
        out.append(f"| {cls} | {ms:.3f} | {pct(ms / step)} | {rate[0]} | {rate[1]} |")
    tc_share, ceiling = t["classes_ms"][TENSOR_CORE] / step, t["tensor_core_tflops"] / peak
    out.append(f"\nThe whole step reaches {t['step_tflops']:,.0f} TFLOP/s ({pct(t['step_tflops'] / peak)} of peak). The "
               f"tensor-core kernels take {pct(tc_share)} of it at {pct(ceiling)} of peak: with every other kernel and "
               "every gap gone, the step could reach no more than that. " + (
                   f"That is below the {pct(MFU_TARGET)} target: the convolution kernels themselves, at these shapes "
                   "(32x32 images, 64 to 512 channels), are the first limit; removing the rest can't reach it."
                   if ceiling < MFU_TARGET else
                   f"That is above the {pct(MFU_TARGET)} target: the other {pct(1 - tc_share)} of the step (memory-bound "
                   "kernels and gaps) is what holds MFU below it."))
    if t.get("norm_class"):
        at_roof = t["norm_gb_per_step"] / t["bandwidth_tbs"]  # ms: the normalisation at the full bandwidth
        best = step - t["classes_ms"][t["norm_class"]] + at_roof
        out.append(f"The normalisation kernels ({t['norm_class']}) must move at least {t['norm_gb_per_step']:.1f} GB per "
                   f"step ({NORM_PASSES} passes over every BatchNorm's activations), and do it at {pct(t['norm_tbs'] / t['bandwidth_tbs'])} "
                   f"or more of the memory bandwidth. At the full bandwidth they would take {at_roof:.2f} ms instead of "
                   f"{t['classes_ms'][t['norm_class']]:.2f}: the step would reach at most "
                   f"{pct(t['flops_per_step'] / best / 1e9 / peak)} of peak. Past that, only moving fewer bytes helps: "
                   "fewer passes, or no BatchNorm.")
    return out


def small_batch_lines(traces: dict) -> list[str]:
    """Why batch 256 runs slower per image than batch 1024, kernel class by kernel class."""
    big, small = traces.get("gpu_resident", {}), traces.get("last_small_batch", {})
    if not (big.get("tensor_core_tflops") and small.get("tensor_core_tflops") and big.get("norm_tbs") and small.get("norm_tbs")):
        return []
    per_image = lambda t: 1000 * t["step_ms"] / t["batch"]  # noqa: E731  (µs)
    return [f"\nPer image, batch {small['batch']} takes {per_image(small):.2f} µs of GPU time against {per_image(big):.2f} "
            f"at batch {big['batch']} ({per_image(big) / per_image(small):.2f} of its speed). Both steps are graphs with "
            f"little idle time ({pct(small['shares']['idle'])} and {pct(big['shares']['idle'])}), so no host work is left to "
            f"remove: the kernels themselves are slower on a quarter of the rows. The convolutions reach "
            f"{pct(small['tensor_core_tflops'] / small['peak_tflops'])} of peak instead of "
            f"{pct(big['tensor_core_tflops'] / big['peak_tflops'])}, the normalisation "
            f"{pct(small['norm_tbs'] / small['bandwidth_tbs'])} of the bandwidth instead of "
            f"{pct(big['norm_tbs'] / big['bandwidth_tbs'])}: fewer tiles to fill the GPU's multiprocessors, "
            "and fixed costs per kernel (the 4x4 maps of the last stage) that a larger batch spreads thinner."]
