"""An out-of-memory error on purpose (notebook 08): PyTorch's message beside the workbook's one line (oom.py), and
fragmentation, the case where `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` helps, measured in a fresh
process each way (the allocator reads the variable once, when CUDA starts).
"""
from __future__ import annotations

import gc
import json
import os
import re
import subprocess
import sys

import torch

from .. import oom
from ..config import ROOT
from . import memory

MiB = memory.MiB


def provoke(example: memory.Example, batch: int, device: str = "cuda") -> dict:
    """One training step at a batch too large for the card: {'torch': PyTorch's message, 'line': the workbook's}."""
    said = {}
    model = example.make().to(device)
    x, y = example.batch(batch, device)
    try:
        with oom.one_line(torch.device(device), batch, "fp32"):
            try:
                memory.loss_of(model(x), y).backward()
            except torch.OutOfMemoryError as e:
                said["torch"] = str(e)
                raise
    except oom.OutOfMemory as e:
        said["line"] = str(e)
    del model, x, y
    gc.collect()
    torch.cuda.empty_cache()
    return said


def stand_in(example: memory.Example, batch: int) -> dict:
    """Without a GPU: a step that raises torch.OutOfMemoryError as CUDA's allocator would, asking for the
    activations the count gives at `batch`; the workbook's line for it."""
    asked = memory.count(example, batch)["activations"] / 2 ** 30
    try:
        with oom.one_line(torch.device("cpu"), batch, "fp32"):
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {asked:.2f} GiB. (a stand-in: "
                                         "no GPU here)")
    except oom.OutOfMemory as e:
        return {"line": str(e)}


def sentences(message: str, at_most: int = 6) -> list[str]:
    """PyTorch's message one sentence a line (its link to the documentation left out)."""
    parts = re.split(r"(?<=\.)\s+(?=[A-Z])", " ".join(message.split()))
    return [p for p in parts if p and not p.startswith("See documentation")][:at_most]


# ---------------------------------------------------------------------------------------------- fragmentation
BLOCK_MIB, BLOCKS, ASK_MIB, CAP_MIB = 60, 20, 700, 1500  # kept every other 60 MiB block, then ask for 700 MiB


def fragment() -> dict:
    """In this process (CUDA started fresh): allocate one 1,200 MiB tensor and free it, carve 20 blocks of 60 MiB
    from that cached memory, free every other one, then ask for 700 MiB under a cap of 1,500 MiB. Live
    tensors hold 600 MiB, so 1,300 MiB would fit, but the free 600 MiB lie in 60 MiB holes."""
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(CAP_MIB * MiB / total)
    big = torch.empty(BLOCK_MIB * BLOCKS * MiB, dtype=torch.uint8, device="cuda")
    del big
    kept = [torch.empty(BLOCK_MIB * MiB, dtype=torch.uint8, device="cuda") for _ in range(BLOCKS)][::2]
    out = {"allocated_mib": torch.cuda.memory_allocated() / MiB, "reserved_mib": torch.cuda.memory_reserved() / MiB}
    try:
        asked = torch.empty(ASK_MIB * MiB, dtype=torch.uint8, device="cuda")
        out["fits"] = True
        del asked
    except torch.OutOfMemoryError as e:
        out["fits"], out["message"] = False, str(e)
    out["reserved_after_mib"] = torch.cuda.memory_reserved() / MiB
    del kept
    return out


def fragmentation(expandable: bool) -> dict:
    """`fragment` in a fresh process, with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True or without it."""
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
    if expandable:
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    code = "import json; from tutorial_lib.lessons import memory_oom as m; print('RESULT', json.dumps(m.fragment()))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    found = [line[7:] for line in p.stdout.splitlines() if line.startswith("RESULT ")]
    if not found:
        return {"error": (p.stderr.strip().splitlines() or ["no output"])[-1][:200]}
    return json.loads(found[0])


def fragmentation_line(name: str, r: dict) -> str:
    """'default allocator: 600 MiB allocated of 1,200 MiB reserved; 700 MiB more: out of memory'."""
    if "error" in r:
        return f"{name}: the measure failed ({r['error']})"
    said = "fits" if r["fits"] else "out of memory"
    return (f"{name}: {r['allocated_mib']:,.0f} MiB allocated of {r['reserved_mib']:,.0f} MiB reserved; "
            f"{ASK_MIB} MiB more under a {CAP_MIB:,} MiB cap: {said}")


def shown(said: dict, record: dict | None) -> list[str]:
    """PyTorch's message (this run's, or the reference run's where this machine has no GPU) and the workbook's line."""
    from .. import reference

    if "torch" in said:
        head, message = "PyTorch's message:", said["torch"]
    elif record is not None:
        head, message = f"PyTorch's message on {reference.where(record)}:", record["figures"]["torch_message"]
    else:
        head, message = "PyTorch's message: (no GPU here and no reference run recorded yet)", ""
    out = [head] + [f"  {s}" for s in sentences(message)]
    return out + ["The workbook's line:", f"  {said['line']}"]


def fragmentation_lines(measured: dict | None, record: dict | None) -> list[str]:
    """Both allocators on the fragmented case: measured here, or the reference run's, or a sentence."""
    from .. import reference

    if measured is None and (record is None or "fragmentation" not in record["figures"]):
        return ["(no GPU here and no reference run recorded yet)"]
    head = "measured here:" if measured is not None else f"measured on {reference.where(record)}:"
    measured = measured or record["figures"]["fragmentation"]
    return [head] + [f"  {fragmentation_line(name, r)}" for name, r in measured.items()]
