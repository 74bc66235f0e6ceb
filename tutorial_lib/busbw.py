"""The all-reduce's bandwidth, one measurement for the doctor (gpucheck's nccl line) and the card
(lessons/allreduce.py): the slowest rank's mean time of `iters` all-reduces of one buffer, reported as nccl-tests
reports it. A ring all-reduce of B bytes on n ranks moves 2(n-1)/n x B through each rank's link, so

    algorithm bandwidth = B / time        bus bandwidth = algorithm bandwidth x 2(n-1)/n

and the bus bandwidth is the link's own speed, whatever n: the figure to compare with a link's datasheet and to
predict another n from.
"""
from __future__ import annotations

import time


def bus_gb_s(nbytes: float, seconds: float, ranks: int) -> float:
    """nccl-tests' busbw of an all-reduce of `nbytes` that took `seconds` on `ranks` ranks, GB/s (1e9 bytes)."""
    return nbytes / seconds * 2 * (ranks - 1) / ranks / 1e9


def timed_allreduce(buf, iters: int) -> float:
    """Seconds per all-reduce of `buf` (a tensor on this rank's device, after a warm-up), the slowest rank's: every
    rank of the initialised process group calls this together."""
    import torch
    import torch.distributed as dist

    sync = torch.cuda.synchronize if buf.is_cuda else (lambda: None)
    for _ in range(3):  # warm-up: the communicator's set-up, the first connection
        dist.all_reduce(buf)
    sync()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    sync()
    worst = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=buf.device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # the slowest rank's time is the collective's
    return float(worst.item())


def words(nbytes: float, seconds: float, ranks: int) -> str:
    """'64 MiB in 0.45 ms: bus bandwidth 265.1 GB/s (algorithm bandwidth 149.1 GB/s x 2(n-1)/n, nccl-tests' busbw)'."""
    alg = nbytes / seconds / 1e9
    return (f"{nbytes / 2**20:,.0f} MiB in {seconds * 1e3:.2f} ms: bus bandwidth {bus_gb_s(nbytes, seconds, ranks):.1f} "
            f"GB/s (algorithm bandwidth {alg:.1f} GB/s x 2(n-1)/n, as nccl-tests reports it)")
