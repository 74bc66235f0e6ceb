"""torch.profiler set-up for the training loop, and NVTX ranges for Nsight Systems."""
from __future__ import annotations

import os
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch

os.environ.setdefault("KINETO_LOG_LEVEL", "99")  # keep the profiler's C++ log lines out of the cells


class _NoProfiler:
    def step(self) -> None:
        pass


def trace_dir(out_dir: str | os.PathLike) -> Path:
    """Where traces go: inside the run's TensorBoard folder, so the PyTorch Profiler tab finds them."""
    return Path(out_dir) / "tb" / "profile"


@contextmanager
def profiler(cfg, env):
    """A torch.profiler.profile configured from cfg (profile=true), one gzipped trace per rank;
    otherwise an object whose step() does nothing."""
    if not cfg.profile:
        yield _NoProfiler()
        return
    activities = [torch.profiler.ProfilerActivity.CPU]
    if env.device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    schedule = torch.profiler.schedule(wait=cfg.profile_wait, warmup=cfg.profile_warmup,
                                       active=cfg.profile_active, repeat=cfg.profile_repeat)
    handler = torch.profiler.tensorboard_trace_handler(
        str(trace_dir(cfg.out_dir)), worker_name=f"rank{env.rank}", use_gzip=True)
    with torch.profiler.profile(activities=activities, schedule=schedule, on_trace_ready=handler,
                                record_shapes=cfg.profile_record_shapes, profile_memory=cfg.profile_memory,
                                with_stack=cfg.profile_with_stack) as prof:
        yield prof


def nvtx_range(name: str, enabled: bool):
    """An NVTX range (seen by `nsys profile --trace=cuda,nvtx`) when enabled and CUDA is present."""
    if enabled and torch.cuda.is_available():
        return torch.cuda.nvtx.range(name)
    return nullcontext()
