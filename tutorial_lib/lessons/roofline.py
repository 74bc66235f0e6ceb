"""How far a profiled training step is from the card's roofs (notebook 04, docs/performance.md): the trace's
kernels in classes, the tensor-core class's FLOP/s against the card's peak and the normalisation class's bytes
against its memory bandwidth. The FLOPs are counted (torch.utils.flop_counter), the bytes bounded from below.
The tables and sentences these figures fill are `perfdoc.roofline_lines` and `perfdoc.small_batch_lines`."""
from __future__ import annotations

import re

from .. import data, models, peaks
from ..config import TrainConfig
# The text of the tables lives with the document they fill (torch-free); notebook 04 calls them from here.
from ..perfdoc import NORM_CLASS, NORM_PASSES, TENSOR_CORE, roofline_lines, small_batch_lines  # noqa: F401

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
