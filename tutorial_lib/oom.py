"""Out of memory in one line (the engine's step loop and the card raise it): the batch, the peak the step reached,
the card's memory, and what to change.

    with oom.one_line(device, batch=256, precision="fp32"):
        run.train_step(x, y)        # torch.OutOfMemoryError -> OutOfMemory("out of memory at batch 256 on ...")

Where much of what PyTorch's allocator holds is reserved but not allocated (free blocks too small for the next
tensor: fragmentation), the line names PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, which lets the allocator
grow its segments instead of cutting new ones.
"""
from __future__ import annotations

import contextlib
import os
import re

import torch

from .errors import UserError

FRAGMENTED = 0.2  # reserved-but-unallocated over reserved beyond which fragmentation is named
MiB = 2 ** 20


class OutOfMemory(UserError):
    """A training step that did not fit in the device's memory; the message names the batch, the peak and the fix."""


def message(e: BaseException, device: torch.device, batch: int, precision: str) -> str:
    """The one line for an out-of-memory error `e` of a step at `batch` and `precision` on `device`."""
    asked = re.search(r"Tried to allocate ([\d.]+ [KMGT]?i?B)", str(e))
    wanted = f" asking for {asked.group(1)} more" if asked else ""
    fixes = [f"a smaller batch (batch_size={max(1, batch // 2)})"]
    if precision == "fp32":
        fixes.append("precision=bf16 (half the activations' bytes)")
    fixes.append("activation checkpointing (torch.utils.checkpoint: recompute activations in the backward pass)")
    where, fragmented = _memory(device)
    line = f"out of memory at batch {batch}{wanted} on {where}; try {', '.join(fixes[:-1])} or {fixes[-1]}"
    if fragmented:
        line += (f"; {fragmented / MiB:,.0f} MiB were reserved but unallocated (fragmentation): set "
                 "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before the run starts")
    return line


def _memory(device: torch.device) -> tuple[str, float]:
    """The device in words with its peak and total memory, and the reserved-but-unallocated bytes worth naming
    (0 when few)."""
    if device.type == "cuda" and torch.cuda.is_available():
        peak, total = torch.cuda.max_memory_allocated(device), torch.cuda.get_device_properties(device).total_memory
        reserved = torch.cuda.memory_reserved(device)
        idle = reserved - torch.cuda.memory_allocated(device)
        name = torch.cuda.get_device_name(device)
        return (f"{name}: the step reached {peak / MiB:,.0f} MiB of its {total / MiB:,.0f} MiB",
                idle if reserved and idle > FRAGMENTED * reserved else 0.0)
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return f"{device.type} (host memory {total / MiB:,.0f} MiB)", 0.0
    except (ValueError, OSError, AttributeError):
        return device.type, 0.0


@contextlib.contextmanager
def one_line(device: torch.device, batch: int, precision: str):
    """torch's out-of-memory error inside the block becomes OutOfMemory (message's line), without its traceback."""
    try:
        yield
    except torch.cuda.OutOfMemoryError as e:  # torch.OutOfMemoryError on torch >= 2.5: the same class
        raise OutOfMemory(message(e, device, batch, precision)) from None
