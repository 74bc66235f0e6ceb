"""A memory snapshot (notebook 08): the caching allocator records every allocation and free with its Python stack
(`torch.cuda.memory._record_memory_history`), `_dump_snapshot` writes them to a pickle, and `summary` reads that
file offline, with no GPU and no browser: the memory allocated after each event, and what was alive at the peak,
by the line of code that allocated it. The same file opens in PyTorch's viewer, https://pytorch.org/memory_viz.
"""
from __future__ import annotations

import linecache
import pickle
from pathlib import Path

from . import memory

MiB = memory.MiB
POINTS = 400  # the timeline kept for the reference file and the plot


def record(example: memory.Example, batch: int, path: str | Path, steps: int = 2) -> Path:
    """`steps` training steps of `example` at `batch` on the GPU with the history on; the snapshot in `path`."""
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.cuda.empty_cache()
    torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")  # C++ stacks: slow to dump
    try:
        model = example.make().cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
        x, y = example.batch(batch, "cuda")
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            loss = memory.loss_of(model(x), y)
            loss.backward()
            opt.step()
        torch.cuda.synchronize()
        torch.cuda.memory._dump_snapshot(str(path))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    del model, opt, x, y, loss
    torch.cuda.empty_cache()
    return path


def where(frames: list[dict]) -> str:
    """The innermost frame outside torch itself, as 'file.py:line  code'."""
    for f in frames:
        name = f.get("filename", "")
        if name.startswith("<") or "/torch/" in name or not name.endswith(".py"):
            continue
        code = linecache.getline(name, f["line"]).strip()
        return f"{Path(name).name}:{f['line']}  {code[:48]}"
    return "(inside torch: no Python frame)"


def summary(path: str | Path, top: int = 6) -> dict:
    """Replay the snapshot's events: the allocated MiB after each (at most POINTS, each the largest of its
    stretch), the peak, and the `top` lines of code by the bytes they held alive at the peak."""
    snap = pickle.loads(Path(path).read_bytes())
    events = [e for e in snap["device_traces"][0] if e["action"] in ("alloc", "free_completed")]
    alive, now, peak, at_peak, curve = {}, 0, -1, {}, []
    for e in events:
        if e["action"] == "alloc":
            alive[e["addr"]] = (e["size"], e.get("frames", []))
            now += e["size"]
        elif e["addr"] in alive:
            now -= alive.pop(e["addr"])[0]
        curve.append(now)
        if now > peak:
            peak, at_peak = now, dict(alive)
    rows: dict[str, list] = {}
    for size, frames in at_peak.values():
        row = rows.setdefault(where(frames), [0, 0])
        row[0], row[1] = row[0] + size, row[1] + 1
    table = sorted(([w, b / MiB, n] for w, (b, n) in rows.items()), key=lambda r: -r[1])[:top]
    reserved = sum(s["total_size"] for s in snap["segments"])
    return {"timeline_mib": _thin(curve), "events": len(events), "peak_mib": peak / MiB,
            "reserved_mib": reserved / MiB, "table": table}


def _thin(curve: list[int]) -> list[float]:
    """At most POINTS values, each the largest of its stretch of events (peaks survive), in MiB."""
    step = max(1, -(-len(curve) // POINTS))
    return [max(curve[i:i + step]) / MiB for i in range(0, len(curve), step)]


def table_lines(s: dict) -> list[str]:
    out = [f"{s['events']:,} events; peak {s['peak_mib']:,.0f} MiB allocated, {s['reserved_mib']:,.0f} MiB reserved "
           "at the end. Alive at the peak, by the line that allocated it:"]
    out += [f"  {mib:8,.0f} MiB in {n:4d} tensors  {w}" for w, mib, n in s["table"]]
    return out
