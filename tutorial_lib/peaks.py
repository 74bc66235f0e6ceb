"""Dense peak TFLOP/s of the cards the workbook meets, per precision: the denominator of MFU (model FLOPs
utilisation = the FLOP/s a run achieved / what the card's tensor cores could do at most). Torch-free.

Every number is NVIDIA's datasheet figure *without* sparsity (the datasheets print the 2:4-sparsity figure,
twice the dense one, marked with an asterisk: those are halved here). "fp32" is the workbook's fp32 (TF32
off): the CUDA cores' FP32 rate, not the tensor cores'.
"""
from __future__ import annotations

# (words that must all appear in torch.cuda.get_device_name()) -> {precision: TFLOP/s}; the first match wins
PEAKS = [
    # H100 SXM5 and PCIe: "NVIDIA H100 Tensor Core GPU" datasheet (2023/2024), FP32 67 / 51, TF32 989 / 756*,
    # BF16 = FP16 1,979 / 1,513* (* with sparsity)
    (("H100", "PCIe"), {"fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5}),
    (("H100", "NVL"), {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5}),  # same datasheet, H100 NVL
    (("H100",), {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5}),  # SXM5 ("H100 80GB HBM3")
    # H200 SXM and NVL: "NVIDIA H200 Tensor Core GPU" datasheet (2024): FP32 67 / 60, TF32 989 / 835*,
    # BF16 = FP16 1,979 / 1,671*
    (("H200", "NVL"), {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5}),
    (("H200",), {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5}),
    # A100 SXM4 and PCIe, 40 and 80 GB: "NVIDIA A100 Tensor Core GPU" datasheet (2021): FP32 19.5,
    # TF32 156 (312*), BF16 = FP16 312 (624*)
    (("A100",), {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}),
]


def _card(table: list, device: str):
    """The value of the first row of `table` whose words all appear in the card's name; None if none does."""
    name = device.upper()
    return next((value for needed, value in table if all(w.upper() in name for w in needed)), None)


def peak_tflops(device: str, precision: str) -> float | None:
    """Dense peak TFLOP/s of the card named `device` (as torch names it, e.g. 'NVIDIA H100 80GB HBM3') for
    `precision`; None for a CPU or a card not in the table."""
    return (_card(PEAKS, device) or {}).get(precision)


# (words that must all appear in the card's name) -> the datasheet its PEAKS row comes from
SOURCES = [(("H100",), "NVIDIA's H100 Tensor Core GPU datasheet"), (("H200",), "NVIDIA's H200 Tensor Core GPU datasheet"),
           (("A100",), "NVIDIA's A100 Tensor Core GPU datasheet")]


def dense_peaks(device: str) -> dict | None:
    """{precision: dense peak TFLOP/s} of the card named `device`, and None for a CPU or a card not in the table."""
    return _card(PEAKS, device)


def source(device: str) -> str | None:
    """Where the card's peaks come from, in words ("NVIDIA's H200 Tensor Core GPU datasheet"), None when unknown."""
    return _card(SOURCES, device) if dense_peaks(device) else None


def mfu(img_s: float, flops_per_image: float | None, device: str, precision: str, devices: int = 1) -> float | None:
    """Achieved FLOP/s (images/s x FLOPs per image) over the peak of `devices` cards; None where unknown."""
    peak = peak_tflops(device, precision)
    if not peak or not flops_per_image or not img_s:
        return None
    return img_s * flops_per_image / (devices * peak * 1e12)


# (words that must all appear in the name) -> memory bandwidth in TB/s, from the same datasheets: the roof of the
# kernels that do little arithmetic per byte (normalisation, element-wise, the optimizer)
BANDWIDTH = [(("H100", "PCIe"), 2.0), (("H100", "NVL"), 3.9), (("H100",), 3.35), (("H200",), 4.8),
             (("A100", "40GB"), 1.555), (("A100",), 2.039)]


def bandwidth_tbs(device: str) -> float | None:
    """Memory bandwidth (TB/s) of the card named `device`; None for a CPU or a card not in the table."""
    return _card(BANDWIDTH, device)
