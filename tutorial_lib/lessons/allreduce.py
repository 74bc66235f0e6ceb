"""What DDP will cost a model: its gradient bytes, the all-reduce bandwidth measured on this node, and the
efficiency they predict on 2, 4 and 8 GPUs (tl.card).

    bw = measure(64 * 2**20)                  # GPUs of this node through NCCL, else 2 CPU processes through gloo
    predict(step_ms=120.0, grad_bytes=102e6, bus_gb_s=bw.bus_gb_s)

The bandwidth is nccl-tests' "bus bandwidth": a ring all-reduce of B bytes on N ranks moves 2(N-1)/N x B bytes
through each rank's link, so it takes B x 2(N-1)/N / bus bandwidth, whatever N. The prediction: each step of the
one-GPU run plus the all-reduce that the backward pass does not hide. DDP starts a bucket's all-reduce as soon as
its gradients are ready, so at best it hides behind the backward pass (about two thirds of a step: backward does
twice the forward's arithmetic); at worst nothing hides. Both bounds are reported.
"""
from __future__ import annotations

import contextlib
import os
import socket
from dataclasses import dataclass

from .. import busbw

BACKWARD_SHARE = 2 / 3  # of a training step: the backward pass does twice the forward's FLOPs
_CACHE: dict = {}


@dataclass(frozen=True)
class Bandwidth:
    bus_gb_s: float  # nccl-tests' bus bandwidth, GB/s (1e9 bytes)
    nbytes: int  # the message all-reduced
    ranks: int
    backend: str  # nccl or gloo
    where: str  # in words: "4 GPUs of this node (NCCL)", "2 CPU processes (gloo)"


def _worker(rank: int, world: int, port: int, backend: str, nbytes: int, iters: int, queue) -> None:
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            **({"device_id": device} if device.type == "cuda" else {}))  # barrier() knows its GPU
    buf = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
    seconds = busbw.timed_allreduce(buf, iters)  # the doctor's measurement too
    if rank == 0:
        queue.put(seconds)
    dist.barrier()
    dist.destroy_process_group()
    del buf


@contextlib.contextmanager
def environment(**values: str):
    """These environment variables set for the block (the processes it starts inherit them), then as they were."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(nbytes: int, gpus: int | None = None, iters: int | None = None) -> Bandwidth:
    """The all-reduce bus bandwidth of `nbytes` (float32) between the GPUs of this node (NCCL, up to 8; `gpus`:
    how many), or with fewer than two GPUs between 2 CPU processes (gloo): not a stand-in for NVLink, a floor.
    Spawns the processes (about 5 s); cached per process."""
    import torch
    import torch.multiprocessing as mp

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    n = min(gpus or visible, visible, 8)
    backend, ranks = ("nccl", n) if n >= 2 else ("gloo", 2)
    iters = iters or (20 if backend == "nccl" else 5)
    key = (backend, ranks, nbytes, iters)
    if key not in _CACHE:
        ctx = mp.get_context("spawn")
        queue = ctx.SimpleQueue()
        with environment(OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1")):
            mp.start_processes(_worker, args=(ranks, free_port(), backend, nbytes, iters, queue), nprocs=ranks,
                               start_method="spawn", join=True)
        seconds = queue.get()
        bus = busbw.bus_gb_s(nbytes, seconds, ranks)
        where = f"{ranks} GPUs of this node (NCCL)" if backend == "nccl" else \
            "2 CPU processes (gloo; this node has fewer than 2 GPUs: a floor, not NVLink)"
        _CACHE[key] = Bandwidth(bus, nbytes, ranks, backend, where)
    return _CACHE[key]


def allreduce_ms(grad_bytes: float, gpus: int, bus_gb_s: float) -> float:
    """A ring all-reduce of `grad_bytes` on `gpus` ranks at `bus_gb_s` (ms)."""
    return 1000 * grad_bytes * 2 * (gpus - 1) / gpus / (bus_gb_s * 1e9)


def predict(step_ms: float, grad_bytes: float, bus_gb_s: float, gpus=(2, 4, 8),
            ddp_step_ms: float | None = None) -> list[dict]:
    """Weak-scaling efficiency of DDP on each of `gpus` against the one-GPU step `step_ms`: `hidden` when the
    all-reduce overlaps the backward pass (BACKWARD_SHARE of the step), `exposed` when nothing overlaps. Each rank's
    step before communication is `ddp_step_ms` (DDP's own cost, measured in one process) or else `step_ms`."""
    rows, base = [], ddp_step_ms or step_ms
    for n in gpus:
        comm = allreduce_ms(grad_bytes, n, bus_gb_s)
        exposed = step_ms / (base + comm)
        hidden = step_ms / (base + max(0.0, comm - BACKWARD_SHARE * base))
        rows.append({"gpus": n, "allreduce_ms": comm, "efficiency_hidden": hidden, "efficiency_exposed": exposed})
    return rows
